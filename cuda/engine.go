package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

// This file holds what an engine process (or a test standing in for one)
// needs: device memory, and the handles that share it with the sidecar. The
// sidecar itself never allocates device memory.

// AllocDevice allocates n bytes of device memory (cuMemAlloc).
func (d *Device) AllocDevice(n uint64) (device.Addr, error) {
	return vendorkit.AllocDevice(&d.core, d.devMem, n, d.malloc, func(n uint64) uint64 { return n })
}

func (d *Device) malloc(n uint64) (device.Addr, error) {
	var p C.CUdeviceptr
	if rc := C.stage_mem_alloc(d.lib.c, d.ctx, C.size_t(n), &p); rc != 0 {
		return 0, d.lib.check(rc, "cuMemAlloc(%d B)", n)
	}
	return device.Addr(p), nil
}

// FreeDevice frees what AllocDevice returned (cuMemFree).
func (d *Device) FreeDevice(a device.Addr) error {
	return vendorkit.FreeDevice(&d.core, d.devMem, a, d.freeDevice)
}

func (d *Device) freeDevice(a device.Addr, _ uint64) error {
	if rc := C.stage_mem_free(d.lib.c, d.ctx, C.CUdeviceptr(a)); rc != 0 {
		return d.lib.check(rc, "cuMemFree(%#x)", uint64(a))
	}
	return nil
}

// CopyHtoD copies src to device address dst and waits (cuMemcpyHtoD).
func (d *Device) CopyHtoD(dst device.Addr, src []byte) error {
	return vendorkit.CopyHtoD(&d.core, dst, src, d.htod)
}

func (d *Device) htod(dst device.Addr, src []byte) error {
	if rc := C.stage_copy_htod(d.lib.c, d.ctx, C.CUdeviceptr(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))); rc != 0 {
		return d.lib.check(rc, "cuMemcpyHtoD(%d B to %#x)", len(src), uint64(dst))
	}
	return nil
}

// CopyDtoH copies len(dst) bytes from device address src into dst and waits
// (cuMemcpyDtoH).
func (d *Device) CopyDtoH(dst []byte, src device.Addr) error {
	return vendorkit.CopyDtoH(&d.core, dst, src, d.dtoh)
}

func (d *Device) dtoh(dst []byte, src device.Addr) error {
	if rc := C.stage_copy_dtoh(d.lib.c, d.ctx, unsafe.Pointer(&dst[0]), C.CUdeviceptr(src), C.size_t(len(dst))); rc != 0 {
		return d.lib.check(rc, "cuMemcpyDtoH(%d B from %#x)", len(dst), uint64(src))
	}
	return nil
}

// VMMAlloc is device memory made with the VMM API (cuMemCreate, reserve,
// map, set access) so that it can be exported as a POSIX fd, the way
// PyTorch's expandable segments allocate.
type VMMAlloc struct {
	d           *Device
	addr        device.Addr
	size        uint64
	handle      C.CUmemGenericAllocationHandle
	handleTypes int
	fabricErr   error

	mu    sync.Mutex
	freed bool
}

// VMMAlloc allocates at least n bytes (rounded up to the allocation
// granularity). It asks for FABRIC|POSIX_FD handles first and falls back to
// POSIX_FD alone when the driver refuses fabric handles with NOT_PERMITTED or
// NOT_SUPPORTED (as on hosts without an IMEX channel); HandleTypes and
// FabricErr say which happened.
func (d *Device) VMMAlloc(n uint64) (*VMMAlloc, error) {
	if n == 0 {
		return nil, fmt.Errorf("cuda: %s: VMMAlloc(0): size must be positive", d)
	}
	if err := d.core.Check("VMMAlloc"); err != nil {
		return nil, err
	}
	if !d.lib.vmm {
		return nil, fmt.Errorf("cuda: %s: VMMAlloc: %s: %w", d, d.lib.vmmWhy, device.ErrNotSupported)
	}
	v := &VMMAlloc{d: d}
	err := v.create(n, HandleTypeFabric|HandleTypePosixFD)
	if err != nil {
		var ce *Error
		if !errors.As(err, &ce) || (ce.Code != codeNotPermitted && ce.Code != codeNotSupported) {
			return nil, err
		}
		v.fabricErr = err
		if err := v.create(n, HandleTypePosixFD); err != nil {
			return nil, fmt.Errorf("%w (after fabric handles were refused: %v)", err, v.fabricErr)
		}
	}
	d.core.Mu.Lock()
	d.vmmAllocs++
	d.core.Mu.Unlock()
	return v, nil
}

func (v *VMMAlloc) create(n uint64, types int) error {
	d := v.d
	size := C.size_t(n)
	var step C.int
	var h C.CUmemGenericAllocationHandle
	var p C.CUdeviceptr
	if rc := C.stage_vmm_setup(d.lib.c, d.ctx, C.int(d.Ordinal()), C.int(types), -1, &size, &h, &p, &step); rc != 0 {
		return d.lib.check(rc, "%s(%d B, handle types %s)", stepName(step), n, handleTypesString(types))
	}
	v.handle, v.addr, v.size = h, device.Addr(p), uint64(size)
	v.handleTypes = types
	return nil
}

func handleTypesString(t int) string {
	switch t {
	case HandleTypeFabric | HandleTypePosixFD:
		return "FABRIC|POSIX_FD"
	case HandleTypePosixFD:
		return "POSIX_FD"
	case HandleTypeFabric:
		return "FABRIC"
	}
	return fmt.Sprintf("%#x", t)
}

// Addr returns the mapped device address.
func (v *VMMAlloc) Addr() device.Addr { return v.addr }

// Size returns the allocation's size (a multiple of the granularity); it is
// the Size to put in the device.Handle.
func (v *VMMAlloc) Size() uint64 { return v.size }

// HandleTypes returns the handle types the allocation was created with:
// HandleTypeFabric|HandleTypePosixFD, or HandleTypePosixFD after the fallback.
func (v *VMMAlloc) HandleTypes() int { return v.handleTypes }

// HandleTypesString renders HandleTypes, e.g. "FABRIC|POSIX_FD".
func (v *VMMAlloc) HandleTypesString() string { return handleTypesString(v.handleTypes) }

// FabricErr is why fabric handles were refused (nil when they were not).
func (v *VMMAlloc) FabricErr() error { return v.fabricErr }

// ExportFD exports the allocation as a new POSIX fd
// (cuMemExportToShareableHandle); the caller owns and closes it.
func (v *VMMAlloc) ExportFD() (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d := v.d
	if v.freed || d.core.IsClosed() {
		return -1, d.core.ErrClosed("VMMAlloc.ExportFD")
	}
	var fd C.int
	if rc := C.stage_vmm_export_fd(d.lib.c, d.ctx, v.handle, &fd); rc != 0 {
		return -1, d.lib.check(rc, "cuMemExportToShareableHandle(%#x, POSIX_FD)", uint64(v.addr))
	}
	return int(fd), nil
}

// Free unmaps and releases the allocation. Importers should have closed
// their mappings first.
func (v *VMMAlloc) Free() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	d := v.d
	if v.freed || d.core.IsClosed() {
		return d.core.ErrClosed("VMMAlloc.Free")
	}
	v.freed = true
	d.core.Mu.Lock()
	d.vmmAllocs--
	d.core.Mu.Unlock()
	var step C.int
	if rc := C.stage_vmm_teardown(d.lib.c, d.ctx, C.CUdeviceptr(v.addr), C.size_t(v.size), v.handle, &step); rc != 0 {
		return d.lib.check(rc, "%s(%#x, %d B)", stepName(step), uint64(v.addr), v.size)
	}
	return nil
}
