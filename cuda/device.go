package cuda

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/stage-kv/stage/cuda/kernels"
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

func init() {
	device.Register(device.KindCUDA, device.Backend{
		Open: Open, Device: (*Device)(nil), Stream: (*Stream)(nil),
		Caps: []device.Capability{
			device.CapHostRegisterer, device.CapSlotRenewer, device.CapExporter, // Device
			device.CapDtoD, device.CapDtoDBatch, device.CapRunCopier, // Stream
		},
	})
}

// Driver constants (cuda.h).
const (
	memHostAllocPortable  = 0x1 // CU_MEMHOSTALLOC_PORTABLE
	memHostAllocDeviceMap = 0x2 // CU_MEMHOSTALLOC_DEVICEMAP
	memHostRegPortable    = 0x1 // CU_MEMHOSTREGISTER_PORTABLE
	memHostRegDeviceMap   = 0x2 // CU_MEMHOSTREGISTER_DEVICEMAP
	streamNonBlocking     = 0x1 // CU_STREAM_NON_BLOCKING
	eventBlockingSync     = 0x1 // CU_EVENT_BLOCKING_SYNC
	eventDisableTiming    = 0x2 // CU_EVENT_DISABLE_TIMING
	ipcLazyPeerAccess     = 0x1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
	attrMultiprocessors   = 16  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
	attrCCMajor           = 75  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	attrCCMinor           = 76  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
)

// Config tunes OpenDevice.
type Config struct {
	// Library is the driver library's path or name; "" means
	// DefaultLibraryName.
	Library string
	// CopyMode forces how multi-segment chunks move; CopyAuto picks
	// kernel, batch, percopy in that order of preference by what loads.
	CopyMode CopyMode
	// PTX replaces the embedded kernel module (kernels.GatherPTX) with
	// this text; PTXFile with the contents of that file. Both empty: the
	// embedded one.
	PTX     string
	PTXFile string
	// EventWait says how Event.Wait waits; the zero value is WaitHybrid.
	EventWait EventWait
	// StridedMaxBytes caps the bytes of one strided descriptor; 0 means
	// DefaultStridedMaxBytes. Not a config key: the GPU benchmarks compare
	// caps with it.
	StridedMaxBytes uint64
}

// Open is the opener registered with device.Register: CUDA device ordinal
// as opts.Backend (a Config built from device.cuda.*; nil: the defaults)
// says. The driver library is loaded on the first call, never at init.
func Open(ordinal int, opts device.Options) (device.Device, error) {
	return device.OpenAs(device.KindCUDA, ordinal, opts, OpenDevice)
}

// OpenDevice opens CUDA device ordinal with SharedLibrary(cfg.Library).
func OpenDevice(ordinal int, cfg Config) (*Device, error) {
	return vendorkit.OpenShared(ordinal, cfg, cfg.Library, SharedLibrary, (*Library).OpenDevice)
}

// Device is one CUDA GPU, driven through its primary context (the one
// PyTorch uses). It implements device.Device, plus helpers for engines and
// tests (AllocDevice, Export, VMMAlloc, CopyHtoD, ...). Safe for
// concurrent use.
type Device struct {
	core vendorkit.Core // name, closed flag, lock (Mu), counts

	lib  *Library
	dev  C.CUdevice
	ctx  C.CUcontext
	name string
	sms  int
	cc   [2]int

	mod        C.CUmodule
	fn         C.CUfunction
	fnStrided  C.CUfunction // nil: the module has no strided kernel
	stridedErr error
	stridedMax uint64 // bytes per strided descriptor at most (Config.StridedMaxBytes)
	mode       CopyMode
	modeWhy    string
	wait       EventWait
	fallback   CopyMode
	kernelErr  error
	batchErr   error

	slotMu sync.Mutex // serializes RenewSlot and FreeSlots

	// Guarded by Core.Mu.
	pinned    vendorkit.Pins[bool] // registered: RegisterHost (else AllocPinned)
	slabs     map[uintptr]slotSlab // AllocSlots slabs by address
	devMem    map[device.Addr]uint64
	vmmAllocs int
}

// OpenDevice initializes the driver (cuInit), retains device ordinal's
// primary context, loads the copy kernel and picks the copy mode.
func (l *Library) OpenDevice(ordinal int, cfg Config) (*Device, error) {
	want, err := ParseCopyMode(string(cfg.CopyMode))
	if err != nil {
		return nil, err
	}
	wait, err := ParseEventWait(string(cfg.EventWait))
	if err != nil {
		return nil, err
	}
	if err := l.init(); err != nil {
		return nil, err
	}
	var count C.int
	if rc := C.stage_device_count(l.c, &count); rc != 0 {
		return nil, l.check(rc, "cuDeviceGetCount")
	}
	if ordinal < 0 || ordinal >= int(count) {
		return nil, fmt.Errorf("cuda: device %d: this process sees %d CUDA devices (check CUDA_VISIBLE_DEVICES and device.ordinal)", ordinal, int(count))
	}
	d := &Device{
		lib:        l,
		wait:       wait,
		pinned:     vendorkit.Pins[bool]{},
		stridedMax: cmp.Or(cfg.StridedMaxBytes, DefaultStridedMaxBytes),
		slabs:      map[uintptr]slotSlab{},
		devMem:     map[device.Addr]uint64{},
	}
	d.core.Init("cuda", ordinal)
	if rc := C.stage_device_get(l.c, C.int(ordinal), &d.dev); rc != 0 {
		return nil, l.check(rc, "cuDeviceGet(%d)", ordinal)
	}
	var buf [256]C.char
	if rc := C.stage_device_name(l.c, d.dev, &buf[0], C.int(len(buf))); rc == 0 {
		d.name = C.GoString(&buf[0])
	}
	d.sms = d.attr(attrMultiprocessors)
	d.cc = [2]int{d.attr(attrCCMajor), d.attr(attrCCMinor)}
	if rc := C.stage_primary_retain(l.c, d.dev, &d.ctx); rc != 0 {
		return nil, l.check(rc, "cuDevicePrimaryCtxRetain(device %d)", ordinal)
	}

	if want == CopyAuto || want == CopyKernel {
		d.kernelErr = d.loadKernel(cfg.PTX, cfg.PTXFile)
	} else {
		d.kernelErr = fmt.Errorf("not loaded (copy mode %s requested)", want)
	}
	if !l.batch {
		d.batchErr = errors.New("cuMemcpyBatchAsync not exported by " + l.Path() + " (driver older than 12.8)")
	}
	d.mode, d.modeWhy, err = chooseCopyMode(want, d.kernelErr, d.batchErr)
	if err != nil {
		d.release()
		return nil, err
	}
	if d.mode == CopyKernel && d.stridedErr != nil {
		d.modeWhy += fmt.Sprintf("; strided kernel unavailable (%v): short segments copy one descriptor each", d.stridedErr)
	}
	d.fallback = fallbackMode(d.batchErr)
	return d, nil
}

func (d *Device) attr(a int) int {
	var v C.int
	if rc := C.stage_device_attr(d.lib.c, d.dev, C.int(a), &v); rc != 0 {
		return 0
	}
	return int(v)
}

func (d *Device) loadKernel(text, file string) error {
	ptx, src := text, "Config.PTX"
	switch {
	case ptx != "":
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("device.cuda.ptx: %w", err)
		}
		ptx, src = string(b), file
	default:
		ptx, src = kernels.GatherPTX, "embedded gather.ptx"
	}
	if strings.TrimSpace(ptx) == "" {
		return fmt.Errorf("%s is empty (generate cuda/kernels/gather.ptx with nvcc)", src)
	}
	cs := C.CString(ptx)
	defer C.free(unsafe.Pointer(cs))
	fname := C.CString(kernels.CopyFunc)
	defer C.free(unsafe.Pointer(fname))
	if rc := C.stage_module_load(d.lib.c, d.ctx, cs, fname, &d.mod, &d.fn); rc != 0 {
		return d.lib.check(rc, "cuModuleLoadData(%s, %s)", src, kernels.CopyFunc)
	}
	// The strided kernel is optional: a module without it (an older
	// device.cuda.ptx) still copies, one plain descriptor per segment.
	sname := C.CString(kernels.StridedFunc)
	defer C.free(unsafe.Pointer(sname))
	if rc := C.stage_module_function(d.lib.c, d.ctx, d.mod, sname, &d.fnStrided); rc != 0 {
		d.fnStrided = nil
		d.stridedErr = d.lib.check(rc, "cuModuleGetFunction(%s, %s)", src, kernels.StridedFunc)
	}
	return nil
}

func (d *Device) release() error {
	var first error
	if d.mod != nil {
		if rc := C.stage_module_unload(d.lib.c, d.ctx, d.mod); rc != 0 {
			first = d.lib.check(rc, "cuModuleUnload")
		}
		d.mod, d.fn, d.fnStrided = nil, nil, nil
	}
	if rc := C.stage_primary_release(d.lib.c, d.dev); rc != 0 && first == nil {
		first = d.lib.check(rc, "cuDevicePrimaryCtxRelease(device %d)", d.Ordinal())
	}
	return first
}

// Kind returns device.KindCUDA.
func (d *Device) Kind() device.Kind { return device.KindCUDA }

// Ordinal returns the CUDA device ordinal.
func (d *Device) Ordinal() int { return d.core.Ordinal() }

// String returns "cuda:N".
func (d *Device) String() string { return d.core.String() }

// Name returns the GPU's name (cuDeviceGetName), e.g. "NVIDIA H100 80GB HBM3".
func (d *Device) Name() string { return d.name }

// ComputeCapability returns the major and minor compute capability.
func (d *Device) ComputeCapability() (int, int) { return d.cc[0], d.cc[1] }

// Multiprocessors returns the SM count.
func (d *Device) Multiprocessors() int { return d.sms }

// Library returns the library the device was opened from.
func (d *Device) Library() *Library { return d.lib }

// CopyMode returns the mode multi-segment chunks use and why it was chosen.
func (d *Device) CopyMode() (CopyMode, string) { return d.mode, d.modeWhy }

// AllocPinned allocates n bytes of page-locked host memory mapped into the
// device's address space (cuMemHostAlloc PORTABLE|DEVICEMAP) and returns both
// views.
func (d *Device) AllocPinned(n int) (device.Pinned, error) {
	if err := vendorkit.Positive(&d.core, "AllocPinned", n); err != nil {
		return device.Pinned{}, err
	}
	var host unsafe.Pointer
	var dev C.CUdeviceptr
	if rc := C.stage_host_alloc(d.lib.c, d.ctx, C.size_t(n), memHostAllocPortable|memHostAllocDeviceMap, &host, &dev); rc != 0 {
		return device.Pinned{}, d.lib.check(rc, "cuMemHostAlloc(%d B, PORTABLE|DEVICEMAP)", n)
	}
	b := unsafe.Slice((*byte)(host), n)
	d.pinned.Add(&d.core, b, false)
	return device.NewPinned(b, device.Addr(dev)), nil
}

// FreePinned frees a buffer AllocPinned returned (the whole buffer).
func (d *Device) FreePinned(p device.Pinned) error {
	key, err := d.takePinned(p, false, "FreePinned")
	if err != nil {
		return err
	}
	if rc := C.stage_host_free(d.lib.c, d.ctx, unsafe.Pointer(&p.Host()[0])); rc != 0 {
		return d.lib.check(rc, "cuMemFreeHost(%#x)", key)
	}
	return nil
}

// RegisterHost page-locks b and maps it into the device's address space
// (cuMemHostRegister PORTABLE|DEVICEMAP). b must stay mapped until
// UnregisterHost, so it must not be Go heap memory that could be collected:
// use mmap'd memory (a memfd shared with another runtime, say) or memory
// from C.
func (d *Device) RegisterHost(b []byte) (device.Pinned, error) {
	if len(b) == 0 {
		return device.Pinned{}, fmt.Errorf("cuda: %s: RegisterHost: empty buffer", d)
	}
	if err := d.core.Check("RegisterHost"); err != nil {
		return device.Pinned{}, err
	}
	key := uintptr(unsafe.Pointer(&b[0]))
	var dev C.CUdeviceptr
	if rc := C.stage_host_register(d.lib.c, d.ctx, C.uintptr_t(key), C.size_t(len(b)), memHostRegPortable|memHostRegDeviceMap, &dev); rc != 0 {
		return device.Pinned{}, d.lib.check(rc, "cuMemHostRegister(%#x, %d B, PORTABLE|DEVICEMAP)", key, len(b))
	}
	d.pinned.Add(&d.core, b, true)
	return device.NewPinned(b, device.Addr(dev)), nil
}

// UnregisterHost undoes RegisterHost (pass what it returned).
func (d *Device) UnregisterHost(p device.Pinned) error {
	key, err := d.takePinned(p, true, "UnregisterHost")
	if err != nil {
		return err
	}
	if rc := C.stage_host_unregister(d.lib.c, d.ctx, C.uintptr_t(key)); rc != 0 {
		return d.lib.check(rc, "cuMemHostUnregister(%#x)", key)
	}
	return nil
}

// takePinned removes p from the pinned table for op, refusing a buffer
// of the other kind (registered: RegisterHost's, else AllocPinned's).
func (d *Device) takePinned(p device.Pinned, registered bool, op string) (uintptr, error) {
	key, _, err := vendorkit.TakePin(&d.core, d.pinned, op, p.Host(), func(reg bool) string {
		switch {
		case reg == registered:
			return ""
		case registered:
			return "buffer came from AllocPinned; use FreePinned"
		}
		return "buffer came from RegisterHost; use UnregisterHost"
	})
	return key, err
}

// NewStream creates a non-blocking stream (CU_STREAM_NON_BLOCKING).
func (d *Device) NewStream() (device.Stream, error) {
	s, err := d.NewCUDAStream()
	if err != nil {
		return nil, err
	}
	return s, nil
}

// NewCUDAStream is NewStream returning the concrete type (for CopyDtoD).
func (d *Device) NewCUDAStream() (*Stream, error) {
	if d.core.IsClosed() {
		return nil, d.core.ErrClosed("NewStream")
	}
	var s C.CUstream
	if rc := C.stage_stream_create(d.lib.c, d.ctx, streamNonBlocking, &s); rc != 0 {
		return nil, d.lib.check(rc, "cuStreamCreate(NON_BLOCKING)")
	}
	d.core.Count(&d.core.Streams, 1)
	return &Stream{d: d, s: s}, nil
}

// NewEvent creates an event without timing (CU_EVENT_DISABLE_TIMING),
// with CU_EVENT_BLOCKING_SYNC unless the device waits by spinning.
func (d *Device) NewEvent() (device.Event, error) {
	if d.core.IsClosed() {
		return nil, d.core.ErrClosed("NewEvent")
	}
	var e C.CUevent
	flags, what := C.uint(eventDisableTiming), "DISABLE_TIMING"
	if d.wait != WaitSpin {
		flags, what = flags|eventBlockingSync, "DISABLE_TIMING|BLOCKING_SYNC"
	}
	if rc := C.stage_event_create(d.lib.c, d.ctx, flags, &e); rc != 0 {
		return nil, d.lib.check(rc, "cuEventCreate(%s)", what)
	}
	d.core.Count(&d.core.Events, 1)
	return &Event{d: d, e: e}, nil
}

// openResources says what is still open, e.g. "1 stream, 2 pinned buffers".
func (d *Device) openResources() string {
	nAlloc, nReg := 0, 0
	for _, r := range d.pinned {
		if r.Rec {
			nReg++
		} else {
			nAlloc++
		}
	}
	return vendorkit.Open(
		vendorkit.Item{N: d.core.Streams, One: "stream", Many: "streams"},
		vendorkit.Item{N: d.core.Events, One: "event", Many: "events"},
		vendorkit.Item{N: nAlloc, One: "pinned buffer", Many: "pinned buffers"},
		vendorkit.Item{N: nReg, One: "registered host buffer", Many: "registered host buffers"},
		vendorkit.Item{N: len(d.slabs), One: "slot slab", Many: "slot slabs"},
		vendorkit.Item{N: d.core.Mappings, One: "mapping", Many: "mappings"},
		vendorkit.Item{N: len(d.devMem), One: "device allocation", Many: "device allocations"},
		vendorkit.Item{N: d.vmmAllocs, One: "VMM allocation", Many: "VMM allocations"})
}

// Close unloads the kernel and releases the primary context. Streams,
// events, pinned buffers, mappings and engine-side allocations must have been
// closed first; Close reports any that were not (their Close returns
// device.ErrClosed afterwards, and what they held goes with the context if
// no one else retains it).
func (d *Device) Close() error {
	leaks, err := d.core.Shut(d.openResources)
	if err != nil {
		return err
	}
	err = d.release()
	if leaks != "" {
		return d.core.Leaked(leaks)
	}
	return err
}
