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
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/stage-kv/stage/device"
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

// Open opens GPU ordinal as opts.Backend (a Config; nil: the defaults)
// configures it; it is the opener registered with device.Register, and
// config.Device.Options builds its Config from device.hip.*. The runtime is
// loaded on the first call, never at init.
func Open(ordinal int, opts device.Options) (device.Device, error) {
	return device.OpenAs(device.KindHIP, ordinal, opts, OpenDevice)
}

// OpenDevice opens GPU ordinal with SharedLibrary(cfg.Library).
func OpenDevice(ordinal int, cfg Config) (*Device, error) {
	l, err := SharedLibrary(cfg.Library)
	if err != nil {
		return nil, err
	}
	return l.OpenDevice(ordinal, cfg)
}

// Device is one AMD GPU as HIP numbers it in this process (after
// HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES). It implements device.Device,
// plus IPC export for engines and tests (Export, AllocDevice, ...). Safe
// for concurrent use.
type Device struct {
	lib     *Library
	ordinal int
	logf    func(string, ...any)

	closed atomic.Bool

	mu      sync.Mutex
	pinned  map[uintptr]int         // host address -> size
	devMem  map[device.Addr]uint64  // AllocDevice allocations
	imports map[ipcKey]*importEntry // open IPC handles, by handle bytes
	streams int
	events  int
	maps    int // Mapping values not yet closed
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
		ordinal: ordinal,
		logf:    cfg.Logf,
		pinned:  map[uintptr]int{},
		devMem:  map[device.Addr]uint64{},
		imports: map[ipcKey]*importEntry{},
	}
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
func (d *Device) Ordinal() int { return d.ordinal }

// String returns "hip:N".
func (d *Device) String() string { return fmt.Sprintf("hip:%d", d.ordinal) }

// Library returns the library the device was opened from.
func (d *Device) Library() *Library { return d.lib }

func (d *Device) errClosed(op string) error {
	return fmt.Errorf("hip: %s: %s: %w", d, op, device.ErrClosed)
}

// dev is the ordinal as the trampolines take it.
func (d *Device) dev() C.int { return C.int(d.ordinal) }

// AllocPinned allocates n bytes of page-locked host memory with
// hipHostMalloc(PORTABLE|MAPPED) and reads the device view of the same pages
// with hipHostGetDevicePointer. Copies take the host view; the device view
// is for kernels and NICs.
func (d *Device) AllocPinned(n int) (device.Pinned, error) {
	if n <= 0 {
		return device.Pinned{}, fmt.Errorf("hip: %s: AllocPinned(%d): size must be positive", d, n)
	}
	if d.closed.Load() {
		return device.Pinned{}, d.errClosed("AllocPinned")
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
	d.mu.Lock()
	d.pinned[uintptr(host)] = n
	d.mu.Unlock()
	return device.NewPinned(unsafe.Slice((*byte)(host), n), device.Addr(dev)), nil
}

// FreePinned frees (hipHostFree) a buffer AllocPinned returned, the whole
// buffer.
func (d *Device) FreePinned(p device.Pinned) error {
	h := p.Host()
	if len(h) == 0 {
		return fmt.Errorf("hip: %s: FreePinned: empty buffer", d)
	}
	host := unsafe.Pointer(&h[0])
	key := uintptr(host)
	d.mu.Lock()
	if d.closed.Load() {
		d.mu.Unlock()
		return d.errClosed("FreePinned")
	}
	n, ok := d.pinned[key]
	switch {
	case !ok:
		d.mu.Unlock()
		return fmt.Errorf("hip: %s: FreePinned(%#x): not a buffer of this device", d, key)
	case n != len(h):
		d.mu.Unlock()
		return fmt.Errorf("hip: %s: FreePinned(%#x): got %d B, the buffer is %d B (pass the whole buffer, not a slice)", d, key, len(h), n)
	}
	delete(d.pinned, key)
	d.mu.Unlock()
	return d.lib.check(C.sthip_host_free(d.lib.c, d.dev(), host), "hipHostFree(%#x, %d B)", key, n)
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
	if d.closed.Load() {
		return nil, d.errClosed("NewStream")
	}
	var s C.hipStream_t
	if err := d.lib.check(C.sthip_stream_create(d.lib.c, d.dev(), streamNonBlocking, &s), "hipStreamCreateWithFlags(NonBlocking)"); err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.streams++
	d.mu.Unlock()
	return &Stream{d: d, s: s}, nil
}

// NewEvent creates an event (hipEventCreateWithFlags, DisableTiming: stage
// only asks whether work is done, and timing costs a timestamp per record).
func (d *Device) NewEvent() (device.Event, error) {
	if d.closed.Load() {
		return nil, d.errClosed("NewEvent")
	}
	var e C.hipEvent_t
	if err := d.lib.check(C.sthip_event_create(d.lib.c, d.dev(), eventDisableTiming, &e), "hipEventCreateWithFlags(DisableTiming)"); err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.events++
	d.mu.Unlock()
	return &Event{d: d, e: e}, nil
}

// EnablePeerAccess lets this device's copies reach memory of device peer
// (hipDeviceEnablePeerAccess). Access already enabled (704) is success.
func (d *Device) EnablePeerAccess(peer int) error {
	if d.closed.Load() {
		return d.errClosed("EnablePeerAccess")
	}
	if d.lib.c.hipDeviceEnablePeerAccess == nil {
		return fmt.Errorf("hip: %s: EnablePeerAccess(%d): %s lacks hipDeviceEnablePeerAccess: %w", d, peer, d.lib.Path(), device.ErrNotSupported)
	}
	err := d.lib.check(C.sthip_enable_peer(d.lib.c, d.dev(), C.int(peer)), "hipDeviceEnablePeerAccess(peer %d, from %d)", peer, d.ordinal)
	if code(err) == codePeerAlreadyEnabled {
		return nil
	}
	return err
}

// openResources says what is still open, e.g. "1 stream, 2 pinned buffers".
func (d *Device) openResources() string {
	var parts []string
	add := func(n int, what string) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(d.streams, "stream(s)")
	add(d.events, "event(s)")
	add(len(d.pinned), "pinned buffer(s)")
	add(d.maps, "mapping(s)")
	add(len(d.imports), "open IPC handle(s)")
	add(len(d.devMem), "device allocation(s)")
	return strings.Join(parts, ", ")
}

// Close releases the device. Streams, events, pinned buffers, mappings and
// engine-side allocations must have been closed first; Close reports any
// that were not (their Close then returns device.ErrClosed). HIP keeps no
// per-device state of ours to release: the runtime stays loaded.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return d.errClosed("Close")
	}
	d.closed.Store(true)
	if leaks := d.openResources(); leaks != "" {
		return fmt.Errorf("hip: %s: Close with resources still open: %s", d, leaks)
	}
	return nil
}
