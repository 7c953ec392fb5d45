package hip

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/stage-kv/stage/device"
)

// This file holds what an engine process (or a test standing in for one)
// needs besides Export: device memory and synchronous copies. The
// sidecar itself never allocates device memory.

// AllocDevice allocates n bytes of device memory (hipMalloc).
func (d *Device) AllocDevice(n uint64) (device.Addr, error) {
	if n == 0 {
		return 0, fmt.Errorf("hip: %s: AllocDevice(0): size must be positive", d)
	}
	if d.closed.Load() {
		return 0, d.errClosed("AllocDevice")
	}
	var p C.uintptr_t
	if err := d.lib.check(C.sthip_malloc(d.lib.c, d.dev(), C.size_t(n), &p), "hipMalloc(%d B)", n); err != nil {
		return 0, err
	}
	d.mu.Lock()
	d.devMem[device.Addr(p)] = n
	d.mu.Unlock()
	return device.Addr(p), nil
}

// FreeDevice frees what AllocDevice returned (hipFree). Importers of the
// allocation must have closed their handles first.
func (d *Device) FreeDevice(a device.Addr) error {
	d.mu.Lock()
	if d.closed.Load() {
		d.mu.Unlock()
		return d.errClosed("FreeDevice")
	}
	n, ok := d.devMem[a]
	if !ok {
		d.mu.Unlock()
		return fmt.Errorf("hip: %s: FreeDevice(%#x): not an allocation of this device", d, uint64(a))
	}
	delete(d.devMem, a)
	d.mu.Unlock()
	return d.lib.check(C.sthip_free(d.lib.c, d.dev(), C.uintptr_t(a)), "hipFree(%#x, %d B)", uint64(a), n)
}

// CopyHtoD copies src to device address dst and waits (hipMemcpy H2D).
func (d *Device) CopyHtoD(dst device.Addr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if d.closed.Load() {
		return d.errClosed("CopyHtoD")
	}
	return d.lib.check(C.sthip_copy_h2d(d.lib.c, d.dev(), C.uintptr_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))),
		"hipMemcpy(H2D, %d B to %#x)", len(src), uint64(dst))
}

// CopyDtoH copies len(dst) bytes from device address src into dst and
// waits (hipMemcpy D2H).
func (d *Device) CopyDtoH(dst []byte, src device.Addr) error {
	if len(dst) == 0 {
		return nil
	}
	if d.closed.Load() {
		return d.errClosed("CopyDtoH")
	}
	return d.lib.check(C.sthip_copy_d2h(d.lib.c, d.dev(), unsafe.Pointer(&dst[0]), C.uintptr_t(src), C.size_t(len(dst))),
		"hipMemcpy(D2H, %d B from %#x)", len(dst), uint64(src))
}
