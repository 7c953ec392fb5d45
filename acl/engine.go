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
)

// This file holds what an engine process (or a test standing in for one)
// needs: device memory, and the export keys that share it with the sidecar.
// The sidecar itself never allocates device memory.

// AllocDevice allocates n bytes of device memory (aclrtMalloc, HUGE_FIRST).
func (d *Device) AllocDevice(n uint64) (device.Addr, error) {
	if n == 0 {
		return 0, fmt.Errorf("acl: %s: AllocDevice(0): size must be positive", d)
	}
	if d.closed.Load() {
		return 0, d.errClosed("AllocDevice")
	}
	var p C.uintptr_t
	if err := d.lib.check(C.stacl_malloc(d.lib.c, d.ctx, C.size_t(n), mallocHugeFirst, &p), "aclrtMalloc(%d B, HUGE_FIRST)", n); err != nil {
		return 0, err
	}
	d.mu.Lock()
	d.devMem[device.Addr(p)] = &allocRec{n: n}
	d.mu.Unlock()
	return device.Addr(p), nil
}

// FreeDevice frees what AllocDevice returned. If the allocation was
// exported, the key is closed first (aclrtIpcMemClose on the exporter side,
// which must come after every importer closed it), then the memory is freed
// (aclrtFree). Both are tried; the error reports either or both.
func (d *Device) FreeDevice(a device.Addr) error {
	d.mu.Lock()
	if d.closed.Load() {
		d.mu.Unlock()
		return d.errClosed("FreeDevice")
	}
	rec, ok := d.devMem[a]
	if !ok {
		d.mu.Unlock()
		return fmt.Errorf("acl: %s: FreeDevice(%#x): not an allocation of this device", d, uint64(a))
	}
	delete(d.devMem, a)
	d.mu.Unlock()
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

// Export shares the allocation holding addr (an AllocDevice allocation of
// this device) by its export key (device.HandleACLKey, the key's
// characters as Bytes): it exports the allocation's BASE (page-aligned, as
// aclrtIpcMemGetExportKey wants) and returns addr's offset inside it and
// the allocation's size. The importer opens the key to
// the base and adds offset back; dropping it moves the wrong bytes.
//
// importers are the ids of the processes allowed to import (each its
// BareTgid: the host pid, also inside containers). The first export of an
// allocation with importers turns the pid whitelist on
// (aclrtIpcMemSetImportPid); without importers the key is exported with pid
// validation disabled, so any process that learns it can map the memory.
// Later calls return the same key and add their importers to the whitelist
// (when it is on). FreeDevice closes the key.
func (d *Device) Export(addr device.Addr, importers ...int32) (device.Export, error) {
	if d.closed.Load() {
		return device.Export{}, d.errClosed("Export")
	}
	if !d.lib.ipc {
		return device.Export{}, fmt.Errorf("acl: %s: Export: %s: %w", d, d.lib.ipcWhy, device.ErrNotSupported)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var base device.Addr
	var rec *allocRec
	for b, r := range d.devMem {
		if addr >= b && uint64(addr-b) < r.n {
			base, rec = b, r
			break
		}
	}
	if rec == nil {
		return device.Export{}, fmt.Errorf("acl: %s: Export(%#x): not inside an AllocDevice allocation of this device", d, uint64(addr))
	}
	l := d.lib
	if rec.key == "" {
		flags := C.uint64_t(exportNoPidCheck)
		if len(importers) > 0 {
			flags = exportPidCheck
		}
		var buf [keyLen]byte
		if err := l.check(C.stacl_ipc_export(l.c, d.ctx, C.uintptr_t(base), C.size_t(rec.n), (*C.char)(unsafe.Pointer(&buf[0])), flags),
			"aclrtIpcMemGetExportKey(base %#x of %#x, %d B, flags %d)", uint64(base), uint64(addr), rec.n, uint64(flags)); err != nil {
			return device.Export{}, err
		}
		k := C.GoString((*C.char)(unsafe.Pointer(&buf[0])))
		if err := checkKey(k); err != nil {
			return device.Export{}, fmt.Errorf("acl: %s: aclrtIpcMemGetExportKey(base %#x) returned a bad key: %v", d, uint64(base), err)
		}
		rec.key, rec.validated = k, len(importers) > 0
	}
	if len(importers) > 0 && rec.validated {
		ck := C.CString(rec.key)
		defer C.free(unsafe.Pointer(ck))
		pids := append([]int32(nil), importers...)
		if err := l.check(C.stacl_ipc_set_pids(l.c, d.ctx, ck, (*C.int32_t)(unsafe.Pointer(&pids[0])), C.size_t(len(pids))),
			"aclrtIpcMemSetImportPid(%q, %v)", rec.key, importers); err != nil {
			return device.Export{}, err
		}
	}
	h := device.Handle{Kind: device.HandleACLKey, Bytes: []byte(rec.key), Size: rec.n, FD: -1}
	return device.Export{Handle: h, Base: base, Offset: uint64(addr - base)}, nil
}

var _ device.Exporter = (*Device)(nil)

// CopyHtoD copies src to device address dst and waits (aclrtMemcpy H2D).
func (d *Device) CopyHtoD(dst device.Addr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if d.closed.Load() {
		return d.errClosed("CopyHtoD")
	}
	return d.lib.check(C.stacl_copy_h2d(d.lib.c, d.ctx, C.uintptr_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))),
		"aclrtMemcpy(H2D, %d B to %#x)", len(src), uint64(dst))
}

// CopyDtoH copies len(dst) bytes from device address src into dst and waits
// (aclrtMemcpy D2H).
func (d *Device) CopyDtoH(dst []byte, src device.Addr) error {
	if len(dst) == 0 {
		return nil
	}
	if d.closed.Load() {
		return d.errClosed("CopyDtoH")
	}
	return d.lib.check(C.stacl_copy_d2h(d.lib.c, d.ctx, unsafe.Pointer(&dst[0]), C.uintptr_t(src), C.size_t(len(dst))),
		"aclrtMemcpy(D2H, %d B from %#x)", len(dst), uint64(src))
}
