package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"syscall"
	"unsafe"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

// VMM handle types (CUmemAllocationHandleType).
const (
	HandleTypePosixFD = 1 // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	HandleTypeFabric  = 8 // CU_MEM_HANDLE_TYPE_FABRIC
)

var vmmStep = [...]string{
	C.STAGE_VMM_GRANULARITY: "cuMemGetAllocationGranularity",
	C.STAGE_VMM_CREATE:      "cuMemCreate",
	C.STAGE_VMM_IMPORT:      "cuMemImportFromShareableHandle",
	C.STAGE_VMM_RESERVE:     "cuMemAddressReserve",
	C.STAGE_VMM_MAP:         "cuMemMap",
	C.STAGE_VMM_ACCESS:      "cuMemSetAccess",
	C.STAGE_VMM_UNMAP:       "cuMemUnmap",
	C.STAGE_VMM_ADDRFREE:    "cuMemAddressFree",
	C.STAGE_VMM_RELEASE:     "cuMemRelease",
	C.STAGE_VMM_EXPORT:      "cuMemExportToShareableHandle",
}

func stepName(step C.int) string {
	if step >= 0 && int(step) < len(vmmStep) {
		return vmmStep[step]
	}
	return fmt.Sprintf("VMM step %d", int(step))
}

// Import maps an allocation shared by an engine process:
//
//   - device.HandleCUDAIPC: the 64-byte legacy IPC handle of the allocation
//     BASE (cuIpcOpenMemHandle_v2 with LAZY_ENABLE_PEER_ACCESS); Size is the
//     allocation's size. The caller adds the region's offset to Base.
//   - device.HandlePosixFD: a VMM allocation exported as a POSIX fd
//     (cuMemImportFromShareableHandle, then reserve, map, set access). The fd
//     stays the caller's; Size is the allocation's size.
//   - device.HandleMemfd: shared host memory (a memfd), mmap'd and
//     registered with the device (cuMemHostRegister DEVICEMAP); Base is its
//     device address.
//
// Each call maps the allocation again; the caller opens each base once and
// counts references (an allocation's legacy IPC handle can be open only once
// per process).
func (d *Device) Import(h device.Handle) (device.Mapping, error) {
	if err := d.core.Check("Import"); err != nil {
		return nil, err
	}
	if h.Size == 0 {
		return nil, fmt.Errorf("cuda: %s: import %s: size 0: %w", d, h.Kind, device.ErrBadHandle)
	}
	var m *mapping
	var err error
	switch h.Kind {
	case device.HandleCUDAIPC:
		m, err = d.importIPC(h)
	case device.HandlePosixFD:
		m, err = d.importFD(h)
	case device.HandleMemfd:
		m, err = d.importMemfd(h)
	default:
		return nil, fmt.Errorf("cuda: %s: import %s: %w by the cuda backend", d, h.Kind, device.ErrNotSupported)
	}
	if err != nil {
		return nil, err
	}
	d.core.Count(&d.core.Mappings, 1)
	return m, nil
}

func (d *Device) importIPC(h device.Handle) (*mapping, error) {
	if len(h.Bytes) != 64 {
		return nil, fmt.Errorf("cuda: %s: import cuda-ipc: handle is %d bytes, want 64: %w", d, len(h.Bytes), device.ErrBadHandle)
	}
	var p C.CUdeviceptr
	if rc := C.stage_ipc_open(d.lib.c, d.ctx, (*C.char)(unsafe.Pointer(&h.Bytes[0])), ipcLazyPeerAccess, &p); rc != 0 {
		return nil, d.lib.check(rc, "cuIpcOpenMemHandle(handle %x..., %d B, LAZY_ENABLE_PEER_ACCESS)", h.Bytes[:8], h.Size)
	}
	// The engine says how large the allocation is; the driver knows. A
	// region that claimed more would let peers reach past the allocation.
	var b C.CUdeviceptr
	var n C.size_t
	rc := C.stage_mem_range(d.lib.c, d.ctx, p, &b, &n)
	if rc != 0 || b != p || uint64(n) < h.Size {
		_ = C.stage_ipc_close(d.lib.c, d.ctx, p)
		if rc != 0 {
			return nil, d.lib.check(rc, "cuMemGetAddressRange(imported %#x)", uint64(p))
		}
		return nil, fmt.Errorf("cuda: %s: import cuda-ipc: the handle's allocation has %d B at %#x, the engine claimed %d B: %w",
			d, uint64(n), uint64(b), h.Size, device.ErrBadHandle)
	}
	return &mapping{d: d, kind: h.Kind, base: device.Addr(p), size: h.Size}, nil
}

func (d *Device) importFD(h device.Handle) (*mapping, error) {
	if !d.lib.vmm {
		return nil, fmt.Errorf("cuda: %s: import posix-fd: %s: %w", d, d.lib.vmmWhy, device.ErrNotSupported)
	}
	if h.FD < 0 {
		return nil, fmt.Errorf("cuda: %s: import posix-fd: no fd: %w", d, device.ErrBadHandle)
	}
	size := C.size_t(h.Size)
	var ah C.CUmemGenericAllocationHandle
	var p C.CUdeviceptr
	var step C.int
	if rc := C.stage_vmm_setup(d.lib.c, d.ctx, C.int(d.Ordinal()), HandleTypePosixFD, C.int(h.FD), &size, &ah, &p, &step); rc != 0 {
		return nil, d.lib.check(rc, "%s(import fd %d, %d B)", stepName(step), h.FD, h.Size)
	}
	return &mapping{d: d, kind: h.Kind, base: device.Addr(p), size: h.Size, vmmHandle: ah, vmmSize: size}, nil
}

func (d *Device) importMemfd(h device.Handle) (*mapping, error) {
	if h.FD < 0 {
		return nil, fmt.Errorf("cuda: %s: import memfd: no fd: %w", d, device.ErrBadHandle)
	}
	// Sealed before the size is read: a memfd that can shrink would fault
	// the sidecar's host accesses once its owner truncates it.
	if err := device.CheckNoShrink(h.FD); err != nil {
		return nil, fmt.Errorf("cuda: %s: import memfd: %w", d, err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(h.FD, &st); err != nil {
		return nil, fmt.Errorf("cuda: %s: import memfd: fstat fd %d: %w", d, h.FD, err)
	}
	if h.Size > uint64(st.Size) {
		// Mapping past the end of the file would fault on access.
		return nil, fmt.Errorf("cuda: %s: import memfd: fd %d has %d B, the engine claimed %d B: %w", d, h.FD, st.Size, h.Size, device.ErrBadHandle)
	}
	b, err := syscall.Mmap(h.FD, 0, int(h.Size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("cuda: %s: import memfd: mmap fd %d (%d B): %w", d, h.FD, h.Size, err)
	}
	key := uintptr(unsafe.Pointer(&b[0]))
	var dev C.CUdeviceptr
	if rc := C.stage_host_register(d.lib.c, d.ctx, C.uintptr_t(key), C.size_t(len(b)), memHostRegPortable|memHostRegDeviceMap, &dev); rc != 0 {
		syscall.Munmap(b)
		return nil, d.lib.check(rc, "cuMemHostRegister(memfd %d, %d B, PORTABLE|DEVICEMAP)", h.FD, h.Size)
	}
	return &mapping{d: d, kind: h.Kind, base: device.Addr(dev), size: h.Size, host: b}, nil
}

// mapping is an imported allocation (device.Mapping).
type mapping struct {
	d    *Device
	kind device.HandleKind
	base device.Addr
	size uint64

	vmmHandle C.CUmemGenericAllocationHandle // posix-fd
	vmmSize   C.size_t                       // posix-fd: size mapped (granularity-aligned)
	host      []byte                         // memfd: the mmap'd pages

	gate vendorkit.Gate
}

func (m *mapping) Base() device.Addr { return m.base }
func (m *mapping) Size() uint64      { return m.size }

// Close unmaps the allocation: cuIpcCloseMemHandle, or unmap + address free
// + release for a VMM import, or unregister + munmap for a memfd.
func (m *mapping) Close() error {
	return m.gate.Close(&m.d.core, "Mapping.Close", &m.d.core.Mappings, m.release)
}

// release is Close's unmapping, by the kind of import.
func (m *mapping) release() error {
	d := m.d
	l := d.lib
	switch m.kind {
	case device.HandleCUDAIPC:
		if rc := C.stage_ipc_close(l.c, d.ctx, C.CUdeviceptr(m.base)); rc != 0 {
			return l.check(rc, "cuIpcCloseMemHandle(%#x)", uint64(m.base))
		}
	case device.HandlePosixFD:
		var step C.int
		if rc := C.stage_vmm_teardown(l.c, d.ctx, C.CUdeviceptr(m.base), m.vmmSize, m.vmmHandle, &step); rc != 0 {
			return l.check(rc, "%s(%#x, %d B)", stepName(step), uint64(m.base), uint64(m.vmmSize))
		}
	case device.HandleMemfd:
		key := uintptr(unsafe.Pointer(&m.host[0]))
		var first error
		if rc := C.stage_host_unregister(l.c, d.ctx, C.uintptr_t(key)); rc != 0 {
			first = l.check(rc, "cuMemHostUnregister(memfd mapping %#x)", key)
		}
		if err := syscall.Munmap(m.host); err != nil && first == nil {
			first = fmt.Errorf("cuda: %s: munmap memfd mapping: %w", d, err)
		}
		m.host = nil
		return first
	}
	return nil
}
