package acl

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/stage-kv/stage/device"
)

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
	if d.core.IsClosed() {
		return device.Export{}, d.core.ErrClosed("Export")
	}
	if !d.lib.ipc {
		return device.Export{}, fmt.Errorf("acl: %s: Export: %s: %w", d, d.lib.ipcWhy, device.ErrNotSupported)
	}
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
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
