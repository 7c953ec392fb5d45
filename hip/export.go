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

// Export shares the allocation holding ptr, any device pointer of this
// device (interior ones included, and memory this package did not
// allocate), by its IPC handle (device.HandleHIPIPC): hipMemGetAddressRange
// finds the allocation's base and size, hipIpcGetMemHandle exports the
// BASE, and the result carries Offset = ptr - base. HIP IPC handles cannot
// be limited to some processes: importers are ignored.
func (d *Device) Export(ptr device.Addr, importers ...int32) (device.Export, error) {
	return vendorkit.ExportBase(&d.core, ptr, device.HandleHIPIPC, d.addressRange, func(b device.Addr, n uint64) ([]byte, error) {
		var handle ipcKey
		if err := d.lib.check(C.sthip_ipc_get(d.lib.c, d.dev(), C.uintptr_t(b), (*C.char)(unsafe.Pointer(&handle[0]))),
			"hipIpcGetMemHandle(base %#x of %#x, %d B)", uint64(b), uint64(ptr), n); err != nil {
			return nil, err
		}
		return handle[:], nil
	})
}

// addressRange returns the base and size of the allocation holding a
// (hipMemGetAddressRange).
func (d *Device) addressRange(a device.Addr) (device.Addr, uint64, error) {
	var base C.uintptr_t
	var size C.size_t
	if err := d.lib.check(C.sthip_mem_range(d.lib.c, d.dev(), C.uintptr_t(a), &base, &size), "hipMemGetAddressRange(%#x)", uint64(a)); err != nil {
		return 0, 0, err
	}
	return device.Addr(base), uint64(size), nil
}

var _ device.Exporter = (*Device)(nil)
