package acl

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

func init() {
	device.Register(device.KindACL, device.Backend{Open: Open, Device: (*Device)(nil), Stream: (*Stream)(nil),
		Caps: []device.Capability{device.CapExporter}})
}

// Runtime constants (acl_rt.h).
const (
	streamFastLaunch = 0x1 // ACL_STREAM_FAST_LAUNCH
	streamFastSync   = 0x2 // ACL_STREAM_FAST_SYNC
	eventSync        = 0x1 // ACL_EVENT_SYNC
	mallocHugeFirst  = 0   // ACL_MEM_MALLOC_HUGE_FIRST
	exportPidCheck   = 0x0 // ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT: importers must be whitelisted
	exportNoPidCheck = 0x1 // ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION
	importDefault    = 0x0 // ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT (same device: no peer access)
	keyLen           = 65  // aclrtIpcMemGetExportKey's key buffer, NUL included
)

// Config tunes OpenDevice.
type Config struct {
	// Library is the runtime library's path or name; "" means
	// DefaultLibraryName.
	Library string
	// CopyMode forces how multi-segment chunks move; CopyAuto picks batch
	// when the library has aclrtMemcpyBatchAsync, else pack.
	CopyMode CopyMode
	// Logf receives the decisions the device makes on its own (the copy
	// mode and why, fallbacks taken at run time). nil means log.Printf.
	Logf func(format string, args ...any)
}

// Open is the opener registered with device.Register: NPU ordinal as
// opts.Backend (a Config built from device.acl.*; nil: the defaults) says.
// The runtime is loaded on the first call, never at init.
func Open(ordinal int, opts device.Options) (device.Device, error) {
	return device.OpenAs(device.KindACL, ordinal, opts, OpenDevice)
}

// OpenDevice opens NPU ordinal with SharedLibrary(cfg.Library).
func OpenDevice(ordinal int, cfg Config) (*Device, error) {
	return vendorkit.OpenShared(ordinal, cfg, cfg.Library, SharedLibrary, (*Library).OpenDevice)
}

// Device is one Ascend NPU, driven through its default context (the one
// aclrtSetDevice creates, shared by every thread of the process that sets
// the same device, torch_npu's included). It implements device.Device, plus
// helpers for engines and tests (AllocDevice, Export, CopyHtoD, ...).
// Safe for concurrent use.
type Device struct {
	core vendorkit.Core // name, closed flag, lock (Mu), counts

	lib  *Library
	ctx  C.aclrtContext
	logf func(string, ...any)

	mode        CopyMode
	modeWhy     string
	batchOff    atomic.Bool   // batch refused at run time: pack from then on
	streamFlags atomic.Uint32 // flags for aclrtCreateStreamWithConfig, 0 once refused
	hostRegOff  atomic.Bool   // aclrtHostRegister not supported: slots have no device view

	physID int32 // the NPU's physical id (aclrtGetPhyDevIdByLogicDevId); -1 unknown

	// Guarded by Core.Mu.
	pinned vendorkit.Pins[bool] // registered: aclrtHostRegister succeeded, unregister before free
	devMem map[device.Addr]*allocRec
	vmmMem map[device.Addr]*vmmAlloc // engine side: AllocVMM

	// vmmMu serializes VMM imports and releases; chunks are the physical
	// chunks imported, by shareable handle (vmm_import.go).
	vmmMu  sync.Mutex
	chunks map[uint64]*chunkRec
}

type allocRec struct {
	n         uint64
	key       string // export key, "" until Export
	validated bool   // exported with the pid whitelist on
}

// OpenDevice initializes the runtime (aclInit), binds device ordinal
// (aclrtSetDevice, once) and keeps its default context, and picks the copy
// mode.
func (l *Library) OpenDevice(ordinal int, cfg Config) (*Device, error) {
	want, err := ParseCopyMode(string(cfg.CopyMode))
	if err != nil {
		return nil, err
	}
	if err := l.init(); err != nil {
		return nil, err
	}
	var count C.uint32_t
	if err := l.check(C.stacl_device_count(l.c, &count), "aclrtGetDeviceCount"); err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= int(count) {
		return nil, fmt.Errorf("acl: device %d: this process sees %d NPUs (check ASCEND_RT_VISIBLE_DEVICES and device.ordinal)", ordinal, int(count))
	}
	d := &Device{
		lib:    l,
		logf:   cfg.Logf,
		pinned: vendorkit.Pins[bool]{},
		devMem: map[device.Addr]*allocRec{},
		vmmMem: map[device.Addr]*vmmAlloc{},
		chunks: map[uint64]*chunkRec{},
		physID: -1,
	}
	d.core.Init("acl", ordinal)
	if d.logf == nil {
		d.logf = log.Printf
	}
	var batchErr error
	if !l.batch {
		batchErr = errors.New("aclrtMemcpyBatchAsync not exported by " + l.Path() + " (CANN older than 8.3)")
	}
	d.mode, d.modeWhy, err = chooseCopyMode(want, batchErr)
	if err != nil {
		return nil, err
	}
	if err := l.check(C.stacl_set_device(l.c, C.int32_t(ordinal), &d.ctx), "aclrtSetDevice(%d)", ordinal); err != nil {
		return nil, err
	}
	if l.fastStream {
		d.streamFlags.Store(streamFastLaunch | streamFastSync)
	}
	if l.c.aclrtGetPhyDevIdByLogicDevId != nil {
		var phys C.int32_t
		if err := l.check(C.stacl_phys_dev(l.c, C.int32_t(ordinal), &phys), "aclrtGetPhyDevIdByLogicDevId(%d)", ordinal); err != nil {
			d.logf("acl: %s: physical id unknown: %v", d, err)
		} else {
			d.physID = int32(phys)
		}
	}
	d.logf("acl: %s (%s): copy mode %s", d, l.Path(), d.modeWhy)
	if abs := l.AbsentList(); len(abs) > 0 {
		d.logf("acl: %s: optional exports absent: %s", d, strings.Join(abs, "; "))
	}
	return d, nil
}

// Kind returns device.KindACL.
func (d *Device) Kind() device.Kind { return device.KindACL }

// Ordinal returns the ACL device id.
func (d *Device) Ordinal() int { return d.core.Ordinal() }

// String returns "acl:N".
func (d *Device) String() string { return d.core.String() }

// Library returns the library the device was opened from.
func (d *Device) Library() *Library { return d.lib }

// CopyMode returns the mode multi-segment chunks use now and why. A batch
// device that the runtime refused batched copies falls back to pack and
// says so here.
func (d *Device) CopyMode() (CopyMode, string) {
	if d.mode == CopyBatch && d.batchOff.Load() {
		return CopyPack, "pack (aclrtMemcpyBatchAsync refused at run time; was " + d.modeWhy + ")"
	}
	return d.mode, d.modeWhy
}

func (d *Device) copyMode() CopyMode {
	if d.mode == CopyBatch && d.batchOff.Load() {
		return CopyPack
	}
	return d.mode
}

// AllocPinned allocates n bytes of page-locked host memory (aclrtMallocHost)
// and registers it with the device (aclrtHostRegister MAPPED) for a device
// view of the same pages, kept as the Pinned's DeviceAddr for kernels and
// NICs. Copies never use that view: aclrtMemcpyAsync takes the host pointer
// (the ACL docs say the registered device address is not for memory
// copies). Where the runtime does not support host registration (207000),
// the buffer has no device view (DeviceAddr 0) and that is logged once.
func (d *Device) AllocPinned(n int) (device.Pinned, error) {
	if err := vendorkit.Positive(&d.core, "AllocPinned", n); err != nil {
		return device.Pinned{}, err
	}
	l := d.lib
	var host unsafe.Pointer
	if err := l.check(C.stacl_malloc_host(l.c, d.ctx, C.size_t(n), &host), "aclrtMallocHost(%d B)", n); err != nil {
		return device.Pinned{}, err
	}
	var dev C.uintptr_t
	registered := false
	if !d.hostRegOff.Load() {
		err := l.check(C.stacl_host_register(l.c, d.ctx, host, C.size_t(n), &dev), "aclrtHostRegister(%p, %d B, MAPPED)", host, n)
		switch {
		case err == nil:
			registered = true
		case errors.Is(err, device.ErrNotSupported):
			if !d.hostRegOff.Swap(true) {
				d.logf("acl: %s: pinned slots get no device view: %v", d, err)
			}
			dev = 0
		default:
			if ferr := l.check(C.stacl_free_host(l.c, d.ctx, host), "aclrtFreeHost(%p)", host); ferr != nil {
				err = errors.Join(err, ferr)
			}
			return device.Pinned{}, err
		}
	}
	b := unsafe.Slice((*byte)(host), n)
	d.pinned.Add(&d.core, b, registered)
	return device.NewPinned(b, device.Addr(dev)), nil
}

// FreePinned unregisters (aclrtHostUnregister) and frees (aclrtFreeHost) a
// buffer AllocPinned returned, the whole buffer. Both are tried; the error
// reports either or both.
func (d *Device) FreePinned(p device.Pinned) error {
	key, rec, err := vendorkit.TakePin(&d.core, d.pinned, "FreePinned", p.Host(), nil)
	if err != nil {
		return err
	}
	host := unsafe.Pointer(&p.Host()[0])
	l := d.lib
	var errs []error
	if rec.Rec {
		if err := l.check(C.stacl_host_unregister(l.c, d.ctx, host), "aclrtHostUnregister(%#x)", key); err != nil {
			errs = append(errs, err)
		}
	}
	if err := l.check(C.stacl_free_host(l.c, d.ctx, host), "aclrtFreeHost(%#x)", key); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// NewStream creates a copy stream: aclrtCreateStreamWithConfig with
// FAST_LAUNCH|FAST_SYNC where the library has it (tasks are issued with
// preallocated resources; a stream synchronize polls instead of sleeping),
// else aclrtCreateStream. A runtime that refuses those flags gets plain
// streams from then on, logged once.
func (d *Device) NewStream() (device.Stream, error) {
	s, err := d.NewACLStream()
	if err != nil {
		return nil, err
	}
	return s, nil
}

// NewACLStream is NewStream returning the concrete type.
func (d *Device) NewACLStream() (*Stream, error) {
	if d.core.IsClosed() {
		return nil, d.core.ErrClosed("NewStream")
	}
	l := d.lib
	var s C.aclrtStream
	flags := d.streamFlags.Load()
	op := "aclrtCreateStream"
	if flags != 0 {
		op = "aclrtCreateStreamWithConfig(priority 0, FAST_LAUNCH|FAST_SYNC)"
	}
	err := l.check(C.stacl_stream_create(l.c, d.ctx, C.uint32_t(flags), &s), "%s", op)
	if err != nil && flags != 0 {
		if d.streamFlags.Swap(0) != 0 {
			d.logf("acl: %s: streams without FAST_LAUNCH|FAST_SYNC from now on: %v", d, err)
		}
		err = l.check(C.stacl_stream_create(l.c, d.ctx, 0, &s), "aclrtCreateStream")
	}
	if err != nil {
		return nil, err
	}
	d.core.Count(&d.core.Streams, 1)
	return &Stream{d: d, s: s}, nil
}

// NewEvent creates an event (aclrtCreateEventWithFlag, ACL_EVENT_SYNC).
func (d *Device) NewEvent() (device.Event, error) {
	if d.core.IsClosed() {
		return nil, d.core.ErrClosed("NewEvent")
	}
	l := d.lib
	var e C.aclrtEvent
	if err := l.check(C.stacl_event_create(l.c, d.ctx, eventSync, &e), "aclrtCreateEventWithFlag(ACL_EVENT_SYNC)"); err != nil {
		return nil, err
	}
	d.core.Count(&d.core.Events, 1)
	return &Event{d: d, e: e}, nil
}

// openResources says what is still open, e.g. "1 stream, 2 pinned buffers".
func (d *Device) openResources() string {
	exported := 0
	for _, r := range d.devMem {
		if r.key != "" {
			exported++
		}
	}
	return vendorkit.Open(
		vendorkit.Item{N: d.core.Streams, One: "stream", Many: "streams"},
		vendorkit.Item{N: d.core.Events, One: "event", Many: "events"},
		vendorkit.Item{N: len(d.pinned), One: "pinned buffer", Many: "pinned buffers"},
		vendorkit.Item{N: d.core.Mappings, One: "mapping", Many: "mappings"},
		vendorkit.Item{N: len(d.devMem), One: "device allocation", Many: "device allocations"},
		vendorkit.Item{N: len(d.vmmMem), One: "VMM allocation", Many: "VMM allocations"},
		vendorkit.Item{N: exported, One: "exported key", Many: "exported keys"})
}

// Close releases the device (aclrtResetDevice, the pair of the open's
// aclrtSetDevice). Streams, events, pinned buffers, mappings and
// engine-side allocations must have been closed first; Close reports any
// that were not (their Close then returns device.ErrClosed). It never calls
// aclFinalize.
func (d *Device) Close() error {
	leaks, err := d.core.Shut(d.openResources)
	if err != nil {
		return err
	}
	err = d.lib.check(C.stacl_reset_device(d.lib.c, C.int32_t(d.Ordinal())), "aclrtResetDevice(%d)", d.Ordinal())
	if leaks != "" {
		return d.core.Leaked(leaks)
	}
	return err
}
