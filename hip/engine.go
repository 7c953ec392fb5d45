package hip

/*
#include "shim.h"
*/
import "C"

import (
	"unsafe"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

// This file holds what an engine process (or a test standing in for one)
// needs besides Export: device memory and synchronous copies. The
// sidecar itself never allocates device memory.

// AllocDevice allocates n bytes of device memory (hipMalloc).
func (d *Device) AllocDevice(n uint64) (device.Addr, error) {
	return vendorkit.AllocDevice(&d.core, d.devMem, n, d.malloc, func(n uint64) uint64 { return n })
}

func (d *Device) malloc(n uint64) (device.Addr, error) {
	var p C.uintptr_t
	err := d.lib.check(C.sthip_malloc(d.lib.c, d.dev(), C.size_t(n), &p), "hipMalloc(%d B)", n)
	return device.Addr(p), err
}

// FreeDevice frees what AllocDevice returned (hipFree). Importers of the
// allocation must have closed their handles first.
func (d *Device) FreeDevice(a device.Addr) error {
	return vendorkit.FreeDevice(&d.core, d.devMem, a, d.freeDevice)
}

func (d *Device) freeDevice(a device.Addr, n uint64) error {
	return d.lib.check(C.sthip_free(d.lib.c, d.dev(), C.uintptr_t(a)), "hipFree(%#x, %d B)", uint64(a), n)
}

// CopyHtoD copies src to device address dst and waits (hipMemcpy H2D).
func (d *Device) CopyHtoD(dst device.Addr, src []byte) error {
	return vendorkit.CopyHtoD(&d.core, dst, src, d.htod)
}

func (d *Device) htod(dst device.Addr, src []byte) error {
	return d.lib.check(C.sthip_copy_h2d(d.lib.c, d.dev(), C.uintptr_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))),
		"hipMemcpy(H2D, %d B to %#x)", len(src), uint64(dst))
}

// CopyDtoH copies len(dst) bytes from device address src into dst and
// waits (hipMemcpy D2H).
func (d *Device) CopyDtoH(dst []byte, src device.Addr) error {
	return vendorkit.CopyDtoH(&d.core, dst, src, d.dtoh)
}

func (d *Device) dtoh(dst []byte, src device.Addr) error {
	return d.lib.check(C.sthip_copy_d2h(d.lib.c, d.dev(), unsafe.Pointer(&dst[0]), C.uintptr_t(src), C.size_t(len(dst))),
		"hipMemcpy(D2H, %d B from %#x)", len(dst), uint64(src))
}
