package hip

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/hex"
	"errors"
	"fmt"
	"unsafe"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

// IPC with the sub-allocation offset.
//
// A HIP IPC handle names an allocation, and hipIpcOpenMemHandle maps it at
// the allocation's BASE, whatever pointer the handle was made from. A
// region that starts inside an allocation (a per-layer view of one KV pool,
// a tensor from PyTorch's caching allocator) is therefore carried as the
// base's handle plus the region's offset inside it, and the offset is added
// back to every address computed from the mapping. Dropping it moves the
// wrong bytes, silently: MoRI's XGMI bug.

// ipcKey is a handle's bytes: the identity of an allocation in the cache.
type ipcKey [ipcHandleSize]byte

// importEntry is one open IPC handle: opened once per device, shared by
// every Mapping of it, closed with the last.
type importEntry struct {
	key  ipcKey
	base device.Addr // what hipIpcOpenMemHandle returned: the allocation base
	size uint64      // the allocation's size, as the runtime reports it
	refs int         // Mappings open on it (guarded by Device.mu)
}

// Import maps an allocation shared by an engine process:
// device.HandleHIPIPC, the 64-byte IPC handle of the allocation BASE
// (Export), with Size the allocation's size. The mapping's Base is the
// allocation base in this process; the caller adds the region's offset (or
// uses ImportRegion, which does).
//
// Each handle is opened once per device (hipIpcOpenMemHandle with
// LazyEnablePeerAccess) and counted: importing it again returns another
// Mapping of the same open handle, and hipIpcCloseMemHandle runs when the
// last Mapping closes. The runtime's allocation size
// (hipMemGetAddressRange of the opened base) bounds every claim: an engine
// claiming more than the allocation holds is refused.
func (d *Device) Import(h device.Handle) (device.Mapping, error) {
	m, err := d.importHandle(h)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (d *Device) importHandle(h device.Handle) (*Mapping, error) {
	if err := d.core.Check("Import"); err != nil {
		return nil, err
	}
	if h.Kind != device.HandleHIPIPC {
		return nil, fmt.Errorf("hip: %s: import %s: %w by the hip backend (register device memory by HIP IPC handle)", d, h.Kind, device.ErrNotSupported)
	}
	if len(h.Bytes) != ipcHandleSize {
		return nil, fmt.Errorf("hip: %s: import hip-ipc: handle is %d bytes, want %d: %w", d, len(h.Bytes), ipcHandleSize, device.ErrBadHandle)
	}
	if h.Size == 0 {
		return nil, fmt.Errorf("hip: %s: import hip-ipc: size 0: %w", d, device.ErrBadHandle)
	}
	var key ipcKey
	copy(key[:], h.Bytes)
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
	e := d.imports[key]
	if e == nil {
		var err error
		if e, err = d.openHandle(key, h.Size); err != nil {
			return nil, err
		}
		d.imports[key] = e
	}
	if h.Size > e.size {
		err := fmt.Errorf("hip: %s: import hip-ipc %s: the engine claims %d B, the allocation has %d B: %w", d, shortHex(key), h.Size, e.size, device.ErrBadHandle)
		if e.refs == 0 {
			delete(d.imports, key)
			err = errors.Join(err, d.closeHandle(e))
		}
		return nil, err
	}
	e.refs++
	d.core.Mappings++
	return &Mapping{d: d, e: e, size: h.Size}, nil
}

// openHandle opens key and asks the runtime what it mapped. Called with
// d.mu held.
func (d *Device) openHandle(key ipcKey, claim uint64) (*importEntry, error) {
	l := d.lib
	var p C.uintptr_t
	if err := l.check(C.sthip_ipc_open(l.c, d.dev(), (*C.char)(unsafe.Pointer(&key[0])), ipcLazyEnablePeer, &p),
		"hipIpcOpenMemHandle(%s, %d B, LazyEnablePeerAccess)", shortHex(key), claim); err != nil {
		return nil, err
	}
	e := &importEntry{key: key, base: device.Addr(p)}
	var base C.uintptr_t
	var size C.size_t
	err := l.check(C.sthip_mem_range(l.c, d.dev(), p, &base, &size), "hipMemGetAddressRange(imported %#x)", uint64(p))
	if err == nil && device.Addr(base) != e.base {
		err = fmt.Errorf("hip: %s: import hip-ipc %s: opened at %#x, inside an allocation based at %#x; the handle should open to the base",
			d, shortHex(key), uint64(p), uint64(base))
	}
	if err != nil {
		return nil, errors.Join(err, d.closeHandle(e))
	}
	e.size = uint64(size)
	return e, nil
}

func (d *Device) closeHandle(e *importEntry) error {
	return d.lib.check(C.sthip_ipc_close(d.lib.c, d.dev(), C.uintptr_t(e.base)), "hipIpcCloseMemHandle(%#x, handle %s)", uint64(e.base), shortHex(e.key))
}

func shortHex(k ipcKey) string { return hex.EncodeToString(k[:8]) + "..." }

// Mapping is one reference to an open IPC handle (device.Mapping).
type Mapping struct {
	d    *Device
	e    *importEntry
	size uint64 // what this import claimed; at most e.size
	gate vendorkit.Gate
}

// Base is the allocation base in this process.
func (m *Mapping) Base() device.Addr { return m.e.base }

// Size is the allocation size this import claimed.
func (m *Mapping) Size() uint64 { return m.size }

// Close drops this reference; the last one closes the handle
// (hipIpcCloseMemHandle).
func (m *Mapping) Close() error {
	d := m.d
	if err := m.gate.Enter(&d.core, "Mapping.Close"); err != nil {
		return err
	}
	defer m.gate.Leave()
	m.gate.MarkClosed()
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
	d.core.Mappings--
	m.e.refs--
	if m.e.refs > 0 {
		return nil
	}
	delete(d.imports, m.e.key)
	return d.closeHandle(m.e)
}

// inRange reports whether [off, off+n) lies inside size bytes, without
// overflowing.
func inRange(off, n, size uint64) bool { return n <= size && off <= size-n }

// Region is a window [Offset, Offset+Len) of an imported allocation: what
// an engine registers when it shares a sub-range. Every address it hands
// out is base + Offset + off, bounds-checked.
type Region struct {
	m      *Mapping
	Offset uint64
	Len    uint64
}

// ImportRegion imports h (see Import) and returns the window [offset,
// offset+length) of it, refusing a window that reaches past the
// allocation (ErrOutOfRange). Close releases the import.
func (d *Device) ImportRegion(h device.Handle, offset, length uint64) (*Region, error) {
	if length == 0 {
		return nil, fmt.Errorf("hip: %s: ImportRegion: length 0: %w", d, ErrOutOfRange)
	}
	if !inRange(offset, length, h.Size) {
		return nil, fmt.Errorf("hip: %s: ImportRegion: offset %d + length %d is past the end of the allocation (%d B): %w", d, offset, length, h.Size, ErrOutOfRange)
	}
	m, err := d.importHandle(h)
	if err != nil {
		return nil, err
	}
	return &Region{m: m, Offset: offset, Len: length}, nil
}

// Mapping returns the import the region lives in.
func (r *Region) Mapping() *Mapping { return r.m }

// Seg returns the device range of the region's bytes [off, off+n) in this
// process: the allocation base plus the region's offset plus off.
func (r *Region) Seg(off, n uint64) (device.Seg, error) {
	if n == 0 || !inRange(off, n, r.Len) {
		return device.Seg{}, fmt.Errorf("hip: region at %d (+%d B) of %s: range [%d, +%d B) is not inside it: %w",
			r.Offset, r.Len, shortHex(r.m.e.key), off, n, ErrOutOfRange)
	}
	return device.Seg{Addr: r.m.Base() + device.Addr(r.Offset+off), Len: n}, nil
}

// Close releases the region's import.
func (r *Region) Close() error { return r.m.Close() }
