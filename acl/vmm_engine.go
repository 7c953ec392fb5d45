package acl

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"

	"github.com/stage-kv/stage/device"
)

// The engine side of VMM memory, for tests and for engines written in Go:
// memory made the way torch_npu's expandable segments make it (one
// reserved range, physical chunks mapped into it in order) and its export
// as a device.HandleACLVMM. stage_client/ascend.py does the same export in
// Python.

// vmmAlloc is one AllocVMM range.
type vmmAlloc struct {
	size      uint64
	chunks    []C.uintptr_t      // physical handles, in order
	sizes     []uint64           // their sizes
	exported  map[uint64]uint64  // chunk address -> shareable handle
	whitelist map[uint64][]int32 // shareable handle -> pids set
}

// VMMGranularity is the runtime's minimum physical chunk size on this
// device (aclrtMemGetAllocationGranularity).
func (d *Device) VMMGranularity() (uint64, error) {
	if !d.lib.vmm || !d.lib.vmmExport {
		return 0, fmt.Errorf("acl: %s: VMMGranularity: the library lacks the VMM calls: %w", d, device.ErrNotSupported)
	}
	var g C.size_t
	err := d.lib.check(C.stacl_vmm_granularity(d.lib.c, d.ctx, C.uint32_t(d.Ordinal()), &g), "aclrtMemGetAllocationGranularity(device %d)", d.Ordinal())
	return uint64(g), err
}

// AllocVMM reserves one range for chunks (each a multiple of
// VMMGranularity), allocates each (aclrtMallocPhysical), maps them in
// order and opens them for reading and writing; FreeVMM undoes it.
func (d *Device) AllocVMM(chunks []uint64) (_ device.Addr, err error) {
	if d.core.IsClosed() {
		return 0, d.core.ErrClosed("AllocVMM")
	}
	if !d.lib.vmm || !d.lib.vmmExport || len(chunks) == 0 {
		return 0, fmt.Errorf("acl: %s: AllocVMM(%d chunks): needs the VMM calls and one chunk at least: %w", d, len(chunks), device.ErrNotSupported)
	}
	l := d.lib
	a := &vmmAlloc{exported: map[uint64]uint64{}, whitelist: map[uint64][]int32{}}
	for _, n := range chunks {
		a.size += n
	}
	var va C.uintptr_t
	if err := l.check(C.stacl_vmm_reserve(l.c, d.ctx, C.size_t(a.size), &va), "aclrtReserveMemAddress(%d B)", a.size); err != nil {
		return 0, err
	}
	mapped := 0
	defer func() {
		if err != nil {
			err = errors.Join(err, d.undoVMM(uint64(va), a, mapped))
		}
	}()
	at := uint64(va)
	for i, n := range chunks {
		var h C.uintptr_t
		if err := l.check(C.stacl_vmm_malloc(l.c, d.ctx, C.uint32_t(d.Ordinal()), C.size_t(n), &h), "aclrtMallocPhysical(%d B, device %d)", n, d.Ordinal()); err != nil {
			return 0, err
		}
		a.chunks, a.sizes = append(a.chunks, h), append(a.sizes, n)
		if err := l.check(C.stacl_vmm_map(l.c, d.ctx, C.uintptr_t(at), C.size_t(n), h), "aclrtMapMem(%#x, %d B, chunk %d)", at, n, i); err != nil {
			return 0, err
		}
		mapped++
		if err := l.check(C.stacl_vmm_access(l.c, d.ctx, C.uintptr_t(at), C.size_t(n), accessReadWrite, C.uint32_t(d.Ordinal())), "aclrtMemSetAccess(%#x, %d B)", at, n); err != nil {
			return 0, err
		}
		at += n
	}
	d.core.Mu.Lock()
	d.vmmMem[device.Addr(va)] = a
	d.core.Mu.Unlock()
	return device.Addr(va), nil
}

// FreeVMM unmaps, frees (exporter side) and releases what AllocVMM made.
// Importers keep their own references to the chunks.
func (d *Device) FreeVMM(base device.Addr) error {
	d.core.Mu.Lock()
	a, ok := d.vmmMem[base]
	delete(d.vmmMem, base)
	d.core.Mu.Unlock()
	if !ok {
		return fmt.Errorf("acl: %s: FreeVMM(%#x): not an AllocVMM range of this device", d, uint64(base))
	}
	return d.undoVMM(uint64(base), a, len(a.chunks))
}

func (d *Device) undoVMM(va uint64, a *vmmAlloc, mapped int) error {
	l := d.lib
	var errs []error
	at := va
	for i := range mapped {
		if err := l.check(C.stacl_vmm_unmap(l.c, d.ctx, C.uintptr_t(at)), "aclrtUnmapMem(%#x)", at); err != nil {
			errs = append(errs, err)
		}
		at += a.sizes[i]
	}
	for i := len(a.chunks) - 1; i >= 0; i-- {
		if err := l.check(C.stacl_vmm_free(l.c, d.ctx, a.chunks[i]), "aclrtFreePhysical(chunk %d)", i); err != nil {
			errs = append(errs, err)
		}
	}
	if err := l.check(C.stacl_vmm_release(l.c, d.ctx, C.uintptr_t(va)), "aclrtReleaseMemAddress(%#x)", va); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ExportVMM shares the n bytes at addr (inside an AllocVMM range) as a
// device.HandleACLVMM: for each chunk under them (aclrtMemGetAddressRange
// names the mapping that holds an address), its handle is retained at the
// mapping's start (aclrtMemRetainAllocationHandle), exported once
// (aclrtMemExportToShareableHandle; CANN allows one export per handle) and
// the retain let go (aclrtFreePhysical), then each importer (a BareTgid) is
// whitelisted (aclrtMemSetPidToShareableHandle). Without importers the
// chunks are exported with pid validation off.
func (d *Device) ExportVMM(addr device.Addr, n uint64, importers ...int32) (device.Handle, error) {
	if d.core.IsClosed() {
		return device.Handle{}, d.core.ErrClosed("ExportVMM")
	}
	if n == 0 || !d.lib.vmmExport || d.lib.c.aclrtMemGetAddressRange == nil {
		return device.Handle{}, fmt.Errorf("acl: %s: ExportVMM(%#x, %d B): needs a size and the VMM export calls: %w", d, uint64(addr), n, device.ErrNotSupported)
	}
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
	var a *vmmAlloc
	for b, r := range d.vmmMem {
		if addr >= b && uint64(addr-b) < r.size && n <= r.size-uint64(addr-b) {
			a = r
		}
	}
	if a == nil {
		return device.Handle{}, fmt.Errorf("acl: %s: ExportVMM(%#x, %d B): not inside one AllocVMM range", d, uint64(addr), n)
	}
	l := d.lib
	v := VMMHandle{PhysDevice: d.physID}
	for p, end := uint64(addr), uint64(addr)+n; p < end; {
		var base C.uintptr_t
		var size C.size_t
		if err := l.check(C.stacl_mem_range(l.c, d.ctx, C.uintptr_t(p), &base, &size), "aclrtMemGetAddressRange(%#x)", p); err != nil {
			return device.Handle{}, err
		}
		if len(v.Chunks) == 0 {
			v.Offset = p - uint64(base)
		}
		sh, err := d.exportChunk(a, uint64(base), importers)
		if err != nil {
			return device.Handle{}, err
		}
		v.Chunks = append(v.Chunks, VMMChunk{Shareable: sh, Size: uint64(size)})
		p = uint64(base) + uint64(size)
	}
	return device.Handle{Kind: device.HandleACLVMM, Bytes: v.Encode(), Size: n, FD: -1}, nil
}

// exportChunk exports the chunk mapped at base once and whitelists
// importers not yet on its list (d.mu held).
func (d *Device) exportChunk(a *vmmAlloc, base uint64, importers []int32) (uint64, error) {
	l := d.lib
	sh, ok := a.exported[base]
	if !ok {
		var h C.uintptr_t
		if err := l.check(C.stacl_vmm_retain(l.c, d.ctx, C.uintptr_t(base), &h), "aclrtMemRetainAllocationHandle(%#x)", base); err != nil {
			return 0, err
		}
		flags := C.uint64_t(exportNoPidCheck)
		if len(importers) > 0 {
			flags = exportPidCheck
		}
		var out C.uint64_t
		err := l.check(C.stacl_vmm_export(l.c, d.ctx, h, flags, &out), "aclrtMemExportToShareableHandle(chunk at %#x, flags %d)", base, uint64(flags))
		if ferr := l.check(C.stacl_vmm_free(l.c, d.ctx, h), "aclrtFreePhysical(retained chunk at %#x)", base); err == nil {
			err = ferr
		}
		if err != nil {
			return 0, err
		}
		sh = uint64(out)
		a.exported[base] = sh
	}
	for _, pid := range importers {
		if containsPid(a.whitelist[sh], pid) {
			continue
		}
		if err := l.check(C.stacl_vmm_set_pid(l.c, d.ctx, C.uint64_t(sh), C.int32_t(pid)), "aclrtMemSetPidToShareableHandle(%#x, %d)", sh, pid); err != nil {
			return 0, err
		}
		a.whitelist[sh] = append(a.whitelist[sh], pid)
	}
	return sh, nil
}

func containsPid(pids []int32, pid int32) bool {
	for _, p := range pids {
		if p == pid {
			return true
		}
	}
	return false
}

// PhysicalID returns the NPU's physical id (aclrtGetPhyDevIdByLogicDevId
// of the ordinal), and false when the library cannot say.
func (d *Device) PhysicalID() (int32, bool) { return d.physID, d.physID >= 0 }

// BareTgid returns the sidecar's process id as the NPU driver knows it and
// where it came from (Library.BareTgid, Library.BareTgidSource).
func (d *Device) BareTgid() (int32, string, error) {
	pid, err := d.lib.BareTgid()
	return pid, d.lib.BareTgidSource(), err
}
