package hip

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"log"
	"strings"
	"unsafe"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

func init() {
	device.Register(device.KindHIP, device.Backend{Open: Open, Device: (*Device)(nil), Stream: (*Stream)(nil),
		Caps: []device.Capability{device.CapExporter, device.CapDtoD}})
}

// Runtime flags (hip_runtime_api.h).
const (
	hostMallocPortable   = 0x1 // hipHostMallocPortable: pinned for every device
	hostMallocMapped     = 0x2 // hipHostMallocMapped: with a device view
	streamNonBlocking    = 0x1 // hipStreamNonBlocking: no sync with the null stream
	eventDisableTiming   = 0x2 // hipEventDisableTiming
	ipcLazyEnablePeer    = 0x1 // hipIpcMemLazyEnablePeerAccess
	ipcHandleSize        = 64  // HIP_IPC_HANDLE_SIZE
	hostAllocStepDevView = 1   // sthip_host_alloc: hipHostGetDevicePointer failed
)

// Config tunes OpenDevice.
type Config struct {
	// Library is the runtime library's path or name; "" means
	// DefaultLibraryName.
	Library string
	// Logf receives what the device decides on its own. nil means
	// log.Printf.
	Logf func(format string, args ...any)
}

// Open is the opener registered with device.Register: GPU ordinal as
// opts.Backend (a Config built from device.hip.*; nil: the defaults) says.
// The runtime is loaded on the first call, never at init.
func Open(ordinal int, opts device.Options) (device.Device, error) {
	return device.OpenAs(device.KindHIP, ordinal, opts, OpenDevice)
}

// OpenDevice opens GPU ordinal with SharedLibrary(cfg.Library).
func OpenDevice(ordinal int, cfg Config) (*Device, error) {
	return vendorkit.OpenShared(ordinal, cfg, cfg.Library, SharedLibrary, (*Library).OpenDevice)
}

// Device is one AMD GPU as HIP numbers it in this process (after
// HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES). It implements device.Device,
// plus IPC export for engines and tests (Export, AllocDevice, ...). Safe
// for concurrent use.
type Device struct {
	core vendorkit.Core // name, closed flag, lock (Mu), counts

	lib  *Library
	logf func(string, ...any)

	// Guarded by Core.Mu.
	pinned  vendorkit.Pins[struct{}]
	devMem  map[device.Addr]uint64  // AllocDevice allocations
	imports map[ipcKey]*importEntry // open IPC handles, by handle bytes
}

// OpenDevice initializes the runtime (hipInit, once per Library) and checks
// that ordinal exists. Every later call makes ordinal the calling thread's
// current device itself.
func (l *Library) OpenDevice(ordinal int, cfg Config) (*Device, error) {
	if err := l.init(); err != nil {
		return nil, err
	}
	var n C.int
	if err := l.check(C.sthip_device_count(l.c, &n), "hipGetDeviceCount"); err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= int(n) {
		return nil, fmt.Errorf("hip: device %d: this process sees %d GPUs (check HIP_VISIBLE_DEVICES and device.ordinal)", ordinal, int(n))
	}
	d := &Device{
		lib:     l,
		logf:    cfg.Logf,
		pinned:  vendorkit.Pins[struct{}]{},
		devMem:  map[device.Addr]uint64{},
		imports: map[ipcKey]*importEntry{},
	}
	d.core.Init("hip", ordinal)
	if d.logf == nil {
		d.logf = log.Printf
	}
	if abs := l.AbsentList(); len(abs) > 0 {
		d.logf("hip: %s (%s): optional exports absent: %s", d, l.Path(), strings.Join(abs, "; "))
	}
	return d, nil
}

// Kind returns device.KindHIP.
func (d *Device) Kind() device.Kind { return device.KindHIP }

// Ordinal returns the HIP device id.
func (d *Device) Ordinal() int { return d.core.Ordinal() }

// String returns "hip:N".
func (d *Device) String() string { return d.core.String() }

// Library returns the library the device was opened from.
func (d *Device) Library() *Library { return d.lib }

// dev is the ordinal as the trampolines take it.
func (d *Device) dev() C.int { return C.int(d.Ordinal()) }

// AllocPinned allocates n bytes of page-locked host memory with
// hipHostMalloc(PORTABLE|MAPPED) and reads the device view of the same pages
// with hipHostGetDevicePointer. Copies take the host view; the device view
// is for kernels and NICs.
func (d *Device) AllocPinned(n int) (device.Pinned, error) {
	if err := vendorkit.Positive(&d.core, "AllocPinned", n); err != nil {
		return device.Pinned{}, err
	}
	var host unsafe.Pointer
	var dev C.uintptr_t
	var step C.int
	r := C.sthip_host_alloc(d.lib.c, d.dev(), C.size_t(n), hostMallocPortable|hostMallocMapped, &host, &dev, &step)
	op := "hipHostMalloc(%d B, PORTABLE|MAPPED)"
	if step == hostAllocStepDevView {
		op = "hipHostGetDevicePointer(pinned buffer of %d B, freed again)"
	}
	if err := d.lib.check(r, op, n); err != nil {
		if errors.Is(err, device.ErrOutOfMemory) {
			err = fmt.Errorf("%w; lower staging.slots or staging.slot_size", err)
		}
		return device.Pinned{}, err
	}
	b := unsafe.Slice((*byte)(host), n)
	d.pinned.Add(&d.core, b, struct{}{})
	return device.NewPinned(b, device.Addr(dev)), nil
}

// FreePinned frees (hipHostFree) a buffer AllocPinned returned, the whole
// buffer.
func (d *Device) FreePinned(p device.Pinned) error {
	key, rec, err := vendorkit.TakePin(&d.core, d.pinned, "FreePinned", p.Host(), nil)
	if err != nil {
		return err
	}
	return d.lib.check(C.sthip_host_free(d.lib.c, d.dev(), unsafe.Pointer(&p.Host()[0])), "hipHostFree(%#x, %d B)", key, rec.N)
}

// NewStream creates a copy stream (hipStreamCreateWithFlags, NonBlocking:
// it never waits for, nor is waited by, the null stream other libraries in
// the process may use).
func (d *Device) NewStream() (device.Stream, error) {
	s, err := d.NewHIPStream()
	if err != nil {
		return nil, err
	}
	return s, nil
}

// NewHIPStream is NewStream returning the concrete type.
func (d *Device) NewHIPStream() (*Stream, error) {
	if d.core.IsClosed() {
		return nil, d.core.ErrClosed("NewStream")
	}
	var s C.hipStream_t
	if err := d.lib.check(C.sthip_stream_create(d.lib.c, d.dev(), streamNonBlocking, &s), "hipStreamCreateWithFlags(NonBlocking)"); err != nil {
		return nil, err
	}
	d.core.Count(&d.core.Streams, 1)
	return &Stream{d: d, s: s}, nil
}

// NewEvent creates an event (hipEventCreateWithFlags, DisableTiming: stage
// only asks whether work is done, and timing costs a timestamp per record).
func (d *Device) NewEvent() (device.Event, error) {
	if d.core.IsClosed() {
		return nil, d.core.ErrClosed("NewEvent")
	}
	var e C.hipEvent_t
	if err := d.lib.check(C.sthip_event_create(d.lib.c, d.dev(), eventDisableTiming, &e), "hipEventCreateWithFlags(DisableTiming)"); err != nil {
		return nil, err
	}
	d.core.Count(&d.core.Events, 1)
	return &Event{d: d, e: e}, nil
}

// EnablePeerAccess lets this device's copies reach memory of device peer
// (hipDeviceEnablePeerAccess). Access already enabled (704) is success.
func (d *Device) EnablePeerAccess(peer int) error {
	if err := d.core.Check("EnablePeerAccess"); err != nil {
		return err
	}
	if d.lib.c.hipDeviceEnablePeerAccess == nil {
		return fmt.Errorf("hip: %s: EnablePeerAccess(%d): %s lacks hipDeviceEnablePeerAccess: %w", d, peer, d.lib.Path(), device.ErrNotSupported)
	}
	err := d.lib.check(C.sthip_enable_peer(d.lib.c, d.dev(), C.int(peer)), "hipDeviceEnablePeerAccess(peer %d, from %d)", peer, d.Ordinal())
	if code(err) == codePeerAlreadyEnabled {
		return nil
	}
	return err
}

// openResources says what is still open, e.g. "1 stream, 2 pinned buffers".
func (d *Device) openResources() string {
	return vendorkit.Open(
		vendorkit.Item{N: d.core.Streams, One: "stream(s)", Many: "stream(s)"},
		vendorkit.Item{N: d.core.Events, One: "event(s)", Many: "event(s)"},
		vendorkit.Item{N: len(d.pinned), One: "pinned buffer(s)", Many: "pinned buffer(s)"},
		vendorkit.Item{N: d.core.Mappings, One: "mapping(s)", Many: "mapping(s)"},
		vendorkit.Item{N: len(d.imports), One: "open IPC handle(s)", Many: "open IPC handle(s)"},
		vendorkit.Item{N: len(d.devMem), One: "device allocation(s)", Many: "device allocation(s)"})
}

// Close releases the device. Streams, events, pinned buffers, mappings and
// engine-side allocations must have been closed first; Close reports any
// that were not (their Close then returns device.ErrClosed). HIP keeps no
// per-device state of ours to release: the runtime stays loaded.
func (d *Device) Close() error {
	leaks, err := d.core.Shut(d.openResources)
	if err != nil {
		return err
	}
	return d.core.Leaked(leaks)
}
