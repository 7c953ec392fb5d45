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

// Import maps an allocation shared by an engine process:
//
//   - device.HandleACLKey: the export key (at most 64 characters) of the
//     allocation BASE, from aclrtIpcMemGetExportKey; Size is the
//     allocation's size. aclrtIpcMemImportByKey returns the base in this
//     process; the caller adds the region's offset. The exporter must have
//     whitelisted this process (aclrtIpcMemSetImportPid with its
//     BareTgid) or exported without pid validation. Where the library has
//     aclrtMemGetAddressRange, the engine's Size is checked against it.
//
//   - device.HandleACLVMM: the physical chunks under the region, each
//     exported with aclrtMemExportToShareableHandle (VMMHandle, vmm.go);
//     Size is the region's length and Base its first byte.
//
// Both refuse memory this sidecar cannot copy (another NPU's): the import
// ends with a probe, a one-byte D2H copy.
//
// device.HandleMemfd (shared host memory) is not supported: copies between
// a pinned slot and registered host memory would be host-to-host
// aclrtMemcpyAsync calls, which the runtime refuses in EP mode, and the
// device address of registered memory is not a memcpy address.
//
// Each call imports again; the caller imports each key once and counts
// references. Mapping.Close is aclrtIpcMemClose: importers close before
// the exporter closes its key and frees the memory.
func (d *Device) Import(h device.Handle) (device.Mapping, error) {
	if err := d.core.Check("Import"); err != nil {
		return nil, err
	}
	if h.Size == 0 {
		return nil, fmt.Errorf("acl: %s: import %s: size 0: %w", d, h.Kind, device.ErrBadHandle)
	}
	switch h.Kind {
	case device.HandleACLKey:
	case device.HandleACLVMM:
		return d.importVMM(h)
	case device.HandleMemfd:
		return nil, fmt.Errorf("acl: %s: import memfd: %w by the acl backend (ACL has no async host-to-host copy in EP mode, and registered host memory's device address is not a memcpy address); register device memory by export key", d, device.ErrNotSupported)
	default:
		return nil, fmt.Errorf("acl: %s: import %s: %w by the acl backend", d, h.Kind, device.ErrNotSupported)
	}
	if !d.lib.ipc {
		return nil, fmt.Errorf("acl: %s: import acl-key: %s: %w", d, d.lib.ipcWhy, device.ErrNotSupported)
	}
	key := string(h.Bytes)
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("acl: %s: import acl-key: %v: %w", d, err, device.ErrBadHandle)
	}
	l := d.lib
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	var p C.uintptr_t
	if err := l.check(C.stacl_ipc_import(l.c, d.ctx, ck, importDefault, &p), "aclrtIpcMemImportByKey(%q, %d B)", key, h.Size); err != nil {
		return nil, err
	}
	if l.c.aclrtMemGetAddressRange != nil {
		// The engine says how large the allocation is; the runtime knows.
		// A region that claimed more would let peers reach past it.
		var base C.uintptr_t
		var size C.size_t
		err := l.check(C.stacl_mem_range(l.c, d.ctx, p, &base, &size), "aclrtMemGetAddressRange(%#x)", uint64(p))
		if err == nil && (base != p || uint64(size) < h.Size) {
			err = fmt.Errorf("acl: %s: import acl-key %q: the runtime maps %d B at %#x (base %#x), the engine claimed %d B: %w",
				d, key, uint64(size), uint64(p), uint64(base), h.Size, device.ErrBadHandle)
		}
		if err != nil {
			return nil, d.closeKeyAfter(ck, key, err)
		}
	}
	if err := d.probe(device.Addr(p)); err != nil {
		return nil, d.closeKeyAfter(ck, key, err)
	}
	d.core.Count(&d.core.Mappings, 1)
	return &mapping{mapHead: mapHead{d: d, base: device.Addr(p), size: h.Size}, key: key}, nil
}

// closeKeyAfter closes an import that failed its checks (err).
func (d *Device) closeKeyAfter(ck *C.char, key string, err error) error {
	if cerr := d.lib.check(C.stacl_ipc_close(d.lib.c, d.ctx, ck), "aclrtIpcMemClose(%q)", key); cerr != nil {
		err = errors.Join(err, cerr)
	}
	return err
}

// checkKey accepts what aclrtIpcMemGetExportKey can produce: 1 to 64
// printable ASCII characters.
func checkKey(key string) error {
	if len(key) == 0 || len(key) >= keyLen {
		return fmt.Errorf("key is %d bytes, want 1 to %d", len(key), keyLen-1)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("key byte %d is %#02x, not printable ASCII", i, c)
		}
	}
	return nil
}

// mapHead is what every kind of mapping has.
type mapHead struct {
	d    *Device
	base device.Addr
	size uint64
	gate vendorkit.Gate
}

func (m *mapHead) Base() device.Addr { return m.base }
func (m *mapHead) Size() uint64      { return m.size }

// close closes the mapping once, uncounts it and runs release (the
// runtime's unmapping).
func (m *mapHead) close(release func() error) error {
	return m.gate.Close(&m.d.core, "Mapping.Close", &m.d.core.Mappings, release)
}

// mapping is an allocation imported by key (device.Mapping).
type mapping struct {
	mapHead
	key string
}

// Close unmaps the allocation (aclrtIpcMemClose of the key, importer side).
func (m *mapping) Close() error {
	return m.close(func() error {
		d := m.d
		ck := C.CString(m.key)
		defer C.free(unsafe.Pointer(ck))
		return d.lib.check(C.stacl_ipc_close(d.lib.c, d.ctx, ck), "aclrtIpcMemClose(%q)", m.key)
	})
}
