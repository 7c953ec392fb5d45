package acl

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/stage-kv/stage/device"
)

// accessReadWrite is ACL_RT_MEM_ACCESS_FLAGS_READWRITE. Every mapping gets
// it, whatever the registration's rights: CANN documents READWRITE as the
// only supported value of aclrtMemSetAccess so far (READ, 0x1, is in the
// header but refused). The region's Access bits still decide which
// transfers may write it.
const accessReadWrite = 0x3

// chunkRec is one imported physical chunk. CANN lets a process import a
// shareable handle once (one handle per shareable handle), so the
// mappings of every registration whose chunks overlap share it.
type chunkRec struct {
	shareable uint64
	h         C.uintptr_t
	size      uint64
	refs      int
}

// importVMM maps a device.HandleACLVMM region: each chunk imported on this
// sidecar's device (aclrtMemImportFromShareableHandle, or reused), one
// range reserved for all of them (aclrtReserveMemAddress), the chunks
// mapped in order (aclrtMapMem) and opened (aclrtMemSetAccess), the region
// starting Offset into the first. Any failure undoes what was done, in
// reverse. A last probe copies the region's first byte to the host: memory
// that lives on another NPU is refused here, by name, not at the first
// transfer.
func (d *Device) importVMM(h device.Handle) (_ device.Mapping, err error) {
	l := d.lib
	if !l.vmm {
		return nil, fmt.Errorf("acl: %s: import acl-vmm: %s: %w", d, l.vmmWhy, device.ErrNotSupported)
	}
	v, err := DecodeVMM(h.Bytes, h.Size)
	if err != nil {
		return nil, fmt.Errorf("acl: %s: import: %v: %w", d, err, device.ErrBadHandle)
	}
	if v.PhysDevice >= 0 && d.physID >= 0 && v.PhysDevice != d.physID {
		return nil, d.wrongDevice(fmt.Sprintf("the engine exported it from physical NPU %d", v.PhysDevice), nil)
	}
	d.vmmMu.Lock()
	defer d.vmmMu.Unlock()
	m := &vmmMapping{mapHead: mapHead{d: d, size: h.Size}}
	defer func() {
		if err != nil {
			if rerr := m.release(); rerr != nil {
				err = errors.Join(err, fmt.Errorf("undoing the import: %w", rerr))
			}
		}
	}()
	for _, c := range v.Chunks {
		rec, err := d.acquireChunk(c)
		if err != nil {
			return nil, err
		}
		m.chunks = append(m.chunks, rec)
	}
	span := v.Span() + v.Offset
	var va C.uintptr_t
	if err := l.check(C.stacl_vmm_reserve(l.c, d.ctx, C.size_t(span), &va), "aclrtReserveMemAddress(%d B)", span); err != nil {
		return nil, err
	}
	m.va, m.reserved = va, span
	at := uint64(va)
	for i, rec := range m.chunks {
		if err := l.check(C.stacl_vmm_map(l.c, d.ctx, C.uintptr_t(at), C.size_t(rec.size), rec.h), "aclrtMapMem(%#x, %d B, chunk %d of %d)", at, rec.size, i, len(m.chunks)); err != nil {
			return nil, err
		}
		m.mapped = append(m.mapped, at)
		if err := l.check(C.stacl_vmm_access(l.c, d.ctx, C.uintptr_t(at), C.size_t(rec.size), accessReadWrite, C.uint32_t(d.Ordinal())),
			"aclrtMemSetAccess(%#x, %d B, READWRITE, device %d)", at, rec.size, d.Ordinal()); err != nil {
			return nil, err
		}
		at += rec.size
	}
	m.base = device.Addr(uint64(va) + v.Offset)
	if err := d.probe(m.base); err != nil {
		return nil, err
	}
	d.core.Count(&d.core.Mappings, 1)
	return m, nil
}

// acquireChunk imports chunk c on this device, or takes another reference
// to its earlier import (vmmMu held).
func (d *Device) acquireChunk(c VMMChunk) (*chunkRec, error) {
	if rec := d.chunks[c.Shareable]; rec != nil {
		if rec.size != c.Size {
			return nil, fmt.Errorf("acl: %s: import acl-vmm: chunk %#x was imported as %d B, now claimed %d B: %w", d, c.Shareable, rec.size, c.Size, device.ErrBadHandle)
		}
		rec.refs++
		return rec, nil
	}
	var h C.uintptr_t
	l := d.lib
	if err := l.check(C.stacl_vmm_import(l.c, d.ctx, C.uint64_t(c.Shareable), C.int32_t(d.Ordinal()), &h),
		"aclrtMemImportFromShareableHandle(%#x, device %d)", c.Shareable, d.Ordinal()); err != nil {
		return nil, err
	}
	rec := &chunkRec{shareable: c.Shareable, h: h, size: c.Size, refs: 1}
	d.chunks[c.Shareable] = rec
	return rec, nil
}

// releaseChunk drops one reference; the last frees the import
// (aclrtFreePhysical, importer side; vmmMu held).
func (d *Device) releaseChunk(rec *chunkRec) error {
	if rec.refs--; rec.refs > 0 {
		return nil
	}
	delete(d.chunks, rec.shareable)
	return d.lib.check(C.stacl_vmm_free(d.lib.c, d.ctx, rec.h), "aclrtFreePhysical(chunk %#x, importer)", rec.shareable)
}

// probe copies the byte at p to the host (aclrtMemcpy D2H): what every
// transfer will do. Memory imported from another NPU fails it.
func (d *Device) probe(p device.Addr) error {
	var b [1]byte
	r := C.stacl_copy_d2h(d.lib.c, d.ctx, unsafe.Pointer(&b[0]), C.uintptr_t(p), 1)
	if err := d.lib.check(r, "aclrtMemcpy(D2H, 1 B at %#x: the import's probe)", uint64(p)); err != nil {
		return d.wrongDevice("a copy of its first byte to the host failed", err)
	}
	return nil
}

// wrongDevice is the refusal of a registration this sidecar cannot copy.
func (d *Device) wrongDevice(why string, cause error) error {
	phys := "its physical id unknown (no aclrtGetPhyDevIdByLogicDevId)"
	if d.physID >= 0 {
		phys = fmt.Sprintf("physical NPU %d", d.physID)
	}
	err := fmt.Errorf("acl: %s: this sidecar cannot copy the registration's memory: %s; memory imported from another NPU cannot be the source or target of H2D/D2H copies. "+
		"This sidecar imports on device.ordinal %d (%s). Run one acl sidecar per NPU and register each engine's memory with the sidecar of its own NPU, "+
		"setting device.ordinal as the sidecar numbers devices (ASCEND_RT_VISIBLE_DEVICES renumbers them from 0): %w", d, why, d.Ordinal(), phys, device.ErrNotSupported)
	if cause != nil {
		err = fmt.Errorf("%w (%v)", err, cause)
	}
	return err
}

// vmmMapping is an imported VMM region (device.Mapping).
type vmmMapping struct {
	mapHead
	chunks   []*chunkRec // acquired, in order
	va       C.uintptr_t // the reserved range; 0 when none
	reserved uint64
	mapped   []uint64 // addresses mapped, in order
}

// Close unmaps the chunks, releases the range and lets go of the chunks,
// in the reverse order of the import.
func (m *vmmMapping) Close() error {
	return m.close(func() error {
		m.d.vmmMu.Lock()
		defer m.d.vmmMu.Unlock()
		return m.release()
	})
}

// release undoes whatever part of the import was done, last step first;
// every step is tried, the errors joined (vmmMu held).
func (m *vmmMapping) release() error {
	d, l := m.d, m.d.lib
	var errs []error
	for i := len(m.mapped) - 1; i >= 0; i-- {
		if err := l.check(C.stacl_vmm_unmap(l.c, d.ctx, C.uintptr_t(m.mapped[i])), "aclrtUnmapMem(%#x)", m.mapped[i]); err != nil {
			errs = append(errs, err)
		}
	}
	m.mapped = nil
	if m.va != 0 {
		if err := l.check(C.stacl_vmm_release(l.c, d.ctx, m.va), "aclrtReleaseMemAddress(%#x, %d B)", uint64(m.va), m.reserved); err != nil {
			errs = append(errs, err)
		}
		m.va = 0
	}
	for i := len(m.chunks) - 1; i >= 0; i-- {
		if err := d.releaseChunk(m.chunks[i]); err != nil {
			errs = append(errs, err)
		}
	}
	m.chunks = nil
	return errors.Join(errs...)
}
