package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"unsafe"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

// Export shares the allocation holding addr by its legacy IPC handle
// (device.HandleCUDAIPC): it finds the allocation's base
// (cuMemGetAddressRange), exports the base (cuIpcGetMemHandle), and returns
// addr's offset inside it and the allocation's size. The importer opens the
// handle to the base and adds the offset back. CUDA IPC handles cannot be
// limited to some processes: importers are ignored.
func (d *Device) Export(addr device.Addr, importers ...int32) (device.Export, error) {
	return vendorkit.ExportBase(&d.core, addr, device.HandleCUDAIPC, d.addressRange, func(b device.Addr, _ uint64) ([]byte, error) {
		var handle [64]byte
		if rc := C.stage_ipc_get(d.lib.c, d.ctx, C.CUdeviceptr(b), (*C.char)(unsafe.Pointer(&handle[0]))); rc != 0 {
			return nil, d.lib.check(rc, "cuIpcGetMemHandle(base %#x of %#x)", uint64(b), uint64(addr))
		}
		return handle[:], nil
	})
}

// addressRange returns the base and size of the allocation holding a
// (cuMemGetAddressRange).
func (d *Device) addressRange(a device.Addr) (device.Addr, uint64, error) {
	var b C.CUdeviceptr
	var n C.size_t
	if rc := C.stage_mem_range(d.lib.c, d.ctx, C.CUdeviceptr(a), &b, &n); rc != 0 {
		return 0, 0, d.lib.check(rc, "cuMemGetAddressRange(%#x)", uint64(a))
	}
	return device.Addr(b), uint64(n), nil
}

var _ device.Exporter = (*Device)(nil)
