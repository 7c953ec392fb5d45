package hostmem

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stage-kv/stage/device"
)

func init() {
	device.Register(device.KindHostmem, device.Backend{Open: Open, Device: (*Dev)(nil), Stream: (*stream)(nil),
		Caps: []device.Capability{device.CapSyncCopier, device.CapHostRegisterer, device.CapSlotRenewer, device.CapDtoD}})
}

var (
	// ErrInjected is wrapped by the error of a copy failed on purpose
	// (FailAfter, Config.Fail).
	ErrInjected = errors.New("injected copy failure")
	// ErrLeaked is wrapped by Dev.Close when something was still open.
	ErrLeaked = errors.New("resources still open")
)

// Stats are a device's counters.
type Stats struct {
	Streams       int    // streams open
	Events        int    // events open
	PinnedBuffers int    // pinned buffers allocated and not freed
	PinnedBytes   uint64 // their total size
	Mappings      int    // imported allocations not closed
	Copies        uint64 // gathers and scatters completed
	Bytes         uint64 // bytes they moved
	Failed        uint64 // copies that failed (injected, or a fault in their memory)
	Skipped       uint64 // copies skipped behind a sticky stream error
}

// Dev is a hostmem device. Open returns one as a device.Device; tests may
// type-assert to *Dev for FailAfter and Stats.
type Dev struct {
	ordinal int
	name    string // "hostmem:0"
	bw      float64
	lat     time.Duration
	d2h     link // gathers
	h2d     link // scatters

	copiesRun atomic.Int64 // copies started, for fault injection
	failAt    atomic.Int64 // copiesRun value that fails; 0: none
	copies    atomic.Uint64
	bytes     atomic.Uint64
	failed    atomic.Uint64
	skipped   atomic.Uint64
	streamIDs atomic.Uint64

	// syncMu is held shared by synchronous copies and exclusively by Close
	// before it unmaps anything, so no copy runs on memory going away.
	syncMu sync.RWMutex

	mu       sync.Mutex
	closed   bool
	pinned   map[uintptr]*pinnedBuf // by address of the first byte
	mappings map[*mapping]struct{}
	streams  map[*stream]struct{}
	events   map[*event]struct{}
	// registered: RegisterHost buffers by address -> length
	registered map[uintptr]int
}

type pinnedBuf struct {
	b    []byte
	fd   int // -1: anonymous (AllocSlots)
	slot int // AllocSlots: the slot size; 0: AllocPinned
}

var _ device.Device = (*Dev)(nil)

// Config models an emulated device's copy engine (device.hostmem.*) and
// arms its fault injection; the zero value copies as fast as memmove and
// never fails on purpose.
type Config struct {
	BandwidthBytesPerSec float64       // 0: as fast as memmove
	Latency              time.Duration // added per copy
	// Fail arms fault injection at open, as FailAfter(FailAfter) does:
	// that many copies succeed and the next fails. staged sets it from the
	// test switch STAGE_TEST_HOSTMEM_FAIL_AFTER (internal/knobs, through
	// config); this package never reads the environment.
	Fail      bool
	FailAfter int64
}

// Open opens emulated device ordinal. Any ordinal >= 0 works; devices with
// the same ordinal are independent. opts.Backend (a Config; nil: the
// defaults) sets the speed model and arms fault injection.
func Open(ordinal int, opts device.Options) (device.Device, error) {
	return device.OpenAs(device.KindHostmem, ordinal, opts, open)
}

func open(ordinal int, cfg Config) (*Dev, error) {
	if ordinal < 0 {
		return nil, fmt.Errorf("hostmem: ordinal %d: must be >= 0", ordinal)
	}
	bw := cfg.BandwidthBytesPerSec
	if math.IsNaN(bw) || math.IsInf(bw, 0) || bw < 0 {
		return nil, fmt.Errorf("hostmem: bandwidth %v B/s: must be a finite number >= 0 (0: as fast as memmove)", bw)
	}
	if cfg.Latency < 0 {
		return nil, fmt.Errorf("hostmem: latency %d ns: must be >= 0", int64(cfg.Latency))
	}
	if cfg.Fail && cfg.FailAfter < 0 {
		return nil, fmt.Errorf("hostmem: fail after %d copies: must be >= 0", cfg.FailAfter)
	}
	d := &Dev{
		ordinal:  ordinal,
		name:     fmt.Sprintf("%s:%d", device.KindHostmem, ordinal),
		bw:       bw,
		lat:      cfg.Latency,
		pinned:   map[uintptr]*pinnedBuf{},
		mappings: map[*mapping]struct{}{},
		streams:  map[*stream]struct{}{},
		events:   map[*event]struct{}{},

		registered: map[uintptr]int{},
	}
	if cfg.Fail {
		d.FailAfter(cfg.FailAfter)
	}
	return d, nil
}

// FailAfter arms fault injection: the next n copies on this device (gathers
// and scatters, on any stream, counted when they run) succeed and the one
// after fails with an error wrapping ErrInjected. It fires once; n < 0
// disarms it.
func (d *Dev) FailAfter(n int64) {
	if n < 0 {
		d.failAt.Store(0)
		return
	}
	d.failAt.Store(d.copiesRun.Load() + n + 1)
}

// injectFault counts a copy about to run and reports whether it must fail.
func (d *Dev) injectFault() bool {
	k := d.copiesRun.Add(1)
	return k == d.failAt.Load() && d.failAt.CompareAndSwap(k, 0)
}

// Stats returns the device's counters.
func (d *Dev) Stats() Stats {
	d.mu.Lock()
	s := Stats{
		Streams:       len(d.streams),
		Events:        len(d.events),
		PinnedBuffers: len(d.pinned),
		Mappings:      len(d.mappings),
	}
	for _, p := range d.pinned {
		s.PinnedBytes += uint64(len(p.b))
	}
	d.mu.Unlock()
	s.Copies = d.copies.Load()
	s.Bytes = d.bytes.Load()
	s.Failed = d.failed.Load()
	s.Skipped = d.skipped.Load()
	return s
}

// Kind returns device.KindHostmem.
func (d *Dev) Kind() device.Kind { return device.KindHostmem }

// Ordinal returns the ordinal Open was given.
func (d *Dev) Ordinal() int { return d.ordinal }

// String returns e.g. "hostmem:0".
func (d *Dev) String() string { return d.name }

func (d *Dev) errClosed(what string) error {
	return fmt.Errorf("%s: %s: device %w", d.name, what, device.ErrClosed)
}

// AllocPinned maps n bytes of a fresh memfd, prefaulted (MAP_POPULATE) so
// that, like pinned memory, it is resident from the start and the first copy
// into it does not pay for page faults. Host() and DeviceAddr() name the same
// pages.
func (d *Dev) AllocPinned(n int) (device.Pinned, error) {
	if n <= 0 {
		return device.Pinned{}, fmt.Errorf("%s: AllocPinned(%d): size must be > 0", d.name, n)
	}
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return device.Pinned{}, d.errClosed(fmt.Sprintf("AllocPinned(%d)", n))
	}
	fd, b, err := memfdMap("stage-"+strings.ReplaceAll(d.name, ":", "-")+"-pinned", n, true)
	if err != nil {
		return device.Pinned{}, fmt.Errorf("%s: AllocPinned(%d): %w", d.name, n, err)
	}
	a := addrOf(b)
	d.mu.Lock()
	if d.closed { // closed meanwhile: give it back
		d.mu.Unlock()
		return device.Pinned{}, errors.Join(d.errClosed(fmt.Sprintf("AllocPinned(%d)", n)), munmap(b), closeFD(fd))
	}
	d.pinned[a] = &pinnedBuf{b: b, fd: fd}
	d.mu.Unlock()
	return device.NewPinned(b, device.Addr(a)), nil
}

// FreePinned unmaps a buffer AllocPinned returned and closes its memfd. It
// must be the whole buffer; freeing a slice, a buffer of another device, or
// one twice is an error wrapping device.ErrBadHandle. After Dev.Close (which
// freed every buffer) it returns an error wrapping device.ErrClosed.
func (d *Dev) FreePinned(p device.Pinned) error {
	h := p.Host()
	a := addrOf(h)
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return d.errClosed(fmt.Sprintf("FreePinned(%#x, %d B)", a, len(h)))
	}
	buf := d.pinned[a]
	switch {
	case buf == nil:
		d.mu.Unlock()
		return fmt.Errorf("%s: FreePinned(%#x, %d B): not a pinned buffer of this device (freed twice?): %w",
			d.name, a, len(h), device.ErrBadHandle)
	case buf.slot > 0:
		d.mu.Unlock()
		return fmt.Errorf("%s: FreePinned(%#x, %d B): the buffer came from AllocSlots; use FreeSlots: %w",
			d.name, a, len(h), device.ErrBadHandle)
	case len(h) != len(buf.b) || p.DeviceAddr() != device.Addr(a):
		d.mu.Unlock()
		return fmt.Errorf("%s: FreePinned(%#x, %d B, device view %#x): the buffer allocated there is %d B at %#x; free the whole buffer AllocPinned returned: %w",
			d.name, a, len(h), uint64(p.DeviceAddr()), len(buf.b), a, device.ErrBadHandle)
	}
	delete(d.pinned, a)
	d.mu.Unlock()
	return d.freeBuf(buf)
}

func (d *Dev) freeBuf(buf *pinnedBuf) error {
	err := munmap(buf.b)
	if buf.fd >= 0 {
		err = errors.Join(err, closeFD(buf.fd))
	}
	if err != nil {
		return fmt.Errorf("%s: free pinned buffer of %d B: %w", d.name, len(buf.b), err)
	}
	return nil
}

// NewStream starts a stream and its worker goroutine.
func (d *Dev) NewStream() (device.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, d.errClosed("NewStream")
	}
	s := newStream(d, d.streamIDs.Add(1), streamQueue)
	d.streams[s] = struct{}{}
	return s, nil
}

// NewEvent creates an event. An event never recorded counts as complete.
func (d *Dev) NewEvent() (device.Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, d.errClosed("NewEvent")
	}
	e := newEvent(d)
	d.events[e] = struct{}{}
	return e, nil
}

// Close releases the device. Everything still open is closed (streams are
// drained first, so no copy is in flight when memory goes away) and reported
// in an error wrapping ErrLeaked. A second Close returns an error wrapping
// device.ErrClosed.
func (d *Dev) Close() error {
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return d.errClosed("Close")
	}
	d.closed = true
	streams := make([]*stream, 0, len(d.streams))
	for s := range d.streams {
		streams = append(streams, s)
	}
	events := make([]*event, 0, len(d.events))
	for e := range d.events {
		events = append(events, e)
	}
	maps := make([]*mapping, 0, len(d.mappings))
	for m := range d.mappings {
		maps = append(maps, m)
	}
	bufs := make([]*pinnedBuf, 0, len(d.pinned))
	var pinnedBytes int
	for _, b := range d.pinned {
		bufs = append(bufs, b)
		pinnedBytes += len(b.b)
	}
	d.pinned = map[uintptr]*pinnedBuf{}
	d.mu.Unlock()

	var errs []error
	for _, s := range streams {
		if err := s.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for _, e := range events {
		if err := e.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for _, m := range maps {
		if err := m.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for _, b := range bufs {
		if err := d.freeBuf(b); err != nil {
			errs = append(errs, err)
		}
	}

	var open []string
	add := func(n int, one, many string) {
		switch {
		case n == 1:
			open = append(open, "1 "+one)
		case n > 1:
			open = append(open, strconv.Itoa(n)+" "+many)
		}
	}
	add(len(streams), "stream", "streams")
	add(len(events), "event", "events")
	if len(bufs) > 0 {
		add(len(bufs), fmt.Sprintf("pinned buffer (%d B)", pinnedBytes), fmt.Sprintf("pinned buffers (%d B)", pinnedBytes))
	}
	add(len(maps), "mapping", "mappings")
	if len(open) > 0 {
		errs = append([]error{fmt.Errorf("%s: Close: %w: %s (closed them now)", d.name, ErrLeaked, strings.Join(open, ", "))}, errs...)
	}
	return errors.Join(errs...)
}

// link paces copies in one direction of the device's emulated link: copies
// of all its streams queue on it one after another at d.bw bytes/s.
type link struct {
	mu   sync.Mutex
	free time.Time // when the link is idle again
}

// reserve books the link for dur from start on (or from when it is free, if
// later) and returns when the booking ends.
func (l *link) reserve(start time.Time, dur time.Duration) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.free.After(start) {
		start = l.free
	}
	l.free = start.Add(dur)
	return l.free
}
