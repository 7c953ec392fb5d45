package acl

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

// This file holds what an engine process (or a test standing in for one)
// needs: device memory, and the export keys that share it with the sidecar.
// The sidecar itself never allocates device memory.

// AllocDevice allocates n bytes of device memory (aclrtMalloc, HUGE_FIRST).
func (d *Device) AllocDevice(n uint64) (device.Addr, error) {
	return vendorkit.AllocDevice(&d.core, d.devMem, n, d.malloc, func(n uint64) *allocRec { return &allocRec{n: n} })
}

func (d *Device) malloc(n uint64) (device.Addr, error) {
	var p C.uintptr_t
	err := d.lib.check(C.stacl_malloc(d.lib.c, d.ctx, C.size_t(n), mallocHugeFirst, &p), "aclrtMalloc(%d B, HUGE_FIRST)", n)
	return device.Addr(p), err
}

// FreeDevice frees what AllocDevice returned. If the allocation was
// exported, the key is closed first (aclrtIpcMemClose on the exporter side,
// which must come after every importer closed it), then the memory is freed
// (aclrtFree). Both are tried; the error reports either or both.
func (d *Device) FreeDevice(a device.Addr) error {
	return vendorkit.FreeDevice(&d.core, d.devMem, a, d.freeDevice)
}

func (d *Device) freeDevice(a device.Addr, rec *allocRec) error {
	l := d.lib
	var errs []error
	if rec.key != "" {
		ck := C.CString(rec.key)
		if err := l.check(C.stacl_ipc_close(l.c, d.ctx, ck), "aclrtIpcMemClose(%q, exporter)", rec.key); err != nil {
			errs = append(errs, fmt.Errorf("%w; importers must close the key first", err))
		}
		C.free(unsafe.Pointer(ck))
	}
	if err := l.check(C.stacl_free(l.c, d.ctx, C.uintptr_t(a)), "aclrtFree(%#x)", uint64(a)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// CopyHtoD copies src to device address dst and waits (aclrtMemcpy H2D).
func (d *Device) CopyHtoD(dst device.Addr, src []byte) error {
	return vendorkit.CopyHtoD(&d.core, dst, src, d.htod)
}

func (d *Device) htod(dst device.Addr, src []byte) error {
	return d.lib.check(C.stacl_copy_h2d(d.lib.c, d.ctx, C.uintptr_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))),
		"aclrtMemcpy(H2D, %d B to %#x)", len(src), uint64(dst))
}

// CopyDtoH copies len(dst) bytes from device address src into dst and waits
// (aclrtMemcpy D2H).
func (d *Device) CopyDtoH(dst []byte, src device.Addr) error {
	return vendorkit.CopyDtoH(&d.core, dst, src, d.dtoh)
}

func (d *Device) dtoh(dst []byte, src device.Addr) error {
	return d.lib.check(C.stacl_copy_d2h(d.lib.c, d.ctx, unsafe.Pointer(&dst[0]), C.uintptr_t(src), C.size_t(len(dst))),
		"aclrtMemcpy(D2H, %d B from %#x)", len(dst), uint64(src))
}
