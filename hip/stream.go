package hip

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
)

// Stream is a non-blocking HIP stream (device.Stream). Its methods may be
// called from any goroutine; calls on one stream are serialized.
type Stream struct {
	d *Device
	s C.hipStream_t

	mu     sync.Mutex
	closed bool
	segs   []device.Seg // merged segments of the chunk being enqueued; reused
}

// Gather enqueues a copy of segs, in order, into dst contiguously (device
// to host). Segments that continue each other are merged first; then each
// range is one hipMemcpyAsync D2H into dst's host address (HIP has no
// batched copy stage binds: per-segment copies, issued in one cgo call).
// segs may be reused when Gather returns.
func (s *Stream) Gather(dst device.Pinned, segs []device.Seg) error {
	return s.move(true, dst, segs)
}

// Scatter enqueues a copy of src, contiguously, into segs (host to device),
// one hipMemcpyAsync H2D per merged range (see Gather).
func (s *Stream) Scatter(segs []device.Seg, src device.Pinned) error {
	return s.move(false, src, segs)
}

// begin locks the stream for op, or fails when the stream or its device
// is closed (then unlocked).
func (s *Stream) begin(op string) error {
	s.mu.Lock()
	if s.closed || s.d.closed.Load() {
		s.mu.Unlock()
		return s.d.errClosed(op)
	}
	return nil
}

// direction names a move for errors: the call, its kind and its verb.
func direction(gather bool) (op, kind, prep string) {
	if gather {
		return "Gather", "D2H", "from"
	}
	return "Scatter", "H2D", "to"
}

// checkSegs adds up segs' lengths, refusing a segment whose end or whose
// running total overflows.
func checkSegs(op string, segs []device.Seg) (uint64, error) {
	var total uint64
	for i, sg := range segs {
		if total+sg.Len < total || uint64(sg.Addr)+sg.Len < uint64(sg.Addr) {
			return 0, fmt.Errorf("%s: segment %d (%#x, %d B) overflows", op, i, uint64(sg.Addr), sg.Len)
		}
		total += sg.Len
	}
	return total, nil
}

func (s *Stream) move(gather bool, p device.Pinned, segs []device.Seg) error {
	op, kind, prep := direction(gather)
	total, err := checkSegs(op, segs)
	if err != nil {
		return fmt.Errorf("hip: %s: %w", s.d, err)
	}
	if total != uint64(p.Len()) {
		return fmt.Errorf("hip: %s: %s: segments add up to %d B, pinned buffer is %d B", s.d, op, total, p.Len())
	}
	if err := s.begin(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if total == 0 {
		return nil
	}
	s.segs = merge(s.segs[:0], segs)
	host := uintptr(unsafe.Pointer(&p.Host()[0]))
	ck := C.int(2) // hipMemcpyDeviceToHost
	if !gather {
		ck = 1 // hipMemcpyHostToDevice
	}
	var idx C.size_t
	var drained C.int
	r := C.sthip_move(s.d.lib.c, s.d.dev(), s.s, ck, C.uintptr_t(host),
		(*C.sthip_seg)(unsafe.Pointer(&s.segs[0])), C.size_t(len(s.segs)), &idx, &drained)
	if r.rc == 0 {
		return nil
	}
	i := int(idx)
	if i >= len(s.segs) {
		i = len(s.segs) - 1
	}
	sg := s.segs[i]
	what := fmt.Sprintf("hipMemcpyAsync(%s, %d B %s %#x) [copy %d of %d, %s of %d B]", kind, sg.Len, prep, uint64(sg.Addr), i+1, len(s.segs), op, total)
	if drained != 0 {
		what += " (copies already queued were waited for)"
	}
	return s.d.lib.check(r, "%s", what)
}

// merge appends segs to out, extending the last range when a segment
// starts where it ends (the pinned side is contiguous anyway) and dropping
// empty ones.
func merge(out, segs []device.Seg) []device.Seg {
	for _, sg := range segs {
		switch last := len(out) - 1; {
		case sg.Len == 0:
		case last >= 0 && out[last].Addr+device.Addr(out[last].Len) == sg.Addr:
			out[last].Len += sg.Len
		default:
			out = append(out, sg)
		}
	}
	return out
}

// CopyDtoD enqueues a device-to-device copy of n bytes (hipMemcpyAsync,
// DeviceToDevice): between two allocations of this device, or from or to
// an imported IPC mapping (the same-node XGMI path). The caller has
// bounds-checked both ranges, e.g. with Region.Seg.
func (s *Stream) CopyDtoD(dst, src device.Addr, n uint64) error {
	if uint64(dst)+n < uint64(dst) || uint64(src)+n < uint64(src) {
		return fmt.Errorf("hip: %s: CopyDtoD(%#x <- %#x, %d B): range overflows", s.d, uint64(dst), uint64(src), n)
	}
	if err := s.begin("CopyDtoD"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if n == 0 {
		return nil
	}
	return s.d.lib.check(C.sthip_copy_d2d_async(s.d.lib.c, s.d.dev(), s.s, C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n)),
		"hipMemcpyAsync(D2D, %d B %#x -> %#x)", n, uint64(src), uint64(dst))
}

// Record enqueues ev, an Event of the same device.
func (s *Stream) Record(ev device.Event) error {
	e, ok := ev.(*Event)
	if !ok || e.d != s.d {
		return fmt.Errorf("hip: %s: Record: event %T is not an event of this device", s.d, ev)
	}
	if err := s.begin("Record"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := e.use("Record(closed event)"); err != nil {
		return err
	}
	defer e.mu.RUnlock()
	return s.d.lib.check(C.sthip_event_record(s.d.lib.c, s.d.dev(), e.e, s.s), "hipEventRecord")
}

// Synchronize waits for all enqueued work (hipStreamSynchronize) and
// returns its error. It blocks the calling OS thread.
func (s *Stream) Synchronize() error {
	if err := s.begin("Synchronize"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	return s.d.lib.check(C.sthip_stream_sync(s.d.lib.c, s.d.dev(), s.s), "hipStreamSynchronize")
}

// Close waits for the stream's work and destroys it. Both are tried; the
// error reports either or both.
func (s *Stream) Close() error {
	if err := s.begin("Stream.Close"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.closed = true
	l := s.d.lib
	var errs []error
	if err := l.check(C.sthip_stream_sync(l.c, s.d.dev(), s.s), "hipStreamSynchronize(before destroy)"); err != nil {
		errs = append(errs, err)
	}
	if err := l.check(C.sthip_stream_destroy(l.c, s.d.dev(), s.s), "hipStreamDestroy"); err != nil {
		errs = append(errs, err)
	}
	s.d.mu.Lock()
	s.d.streams--
	s.d.mu.Unlock()
	return errors.Join(errs...)
}

// Event is a HIP event created with DisableTiming (device.Event).
type Event struct {
	d *Device
	e C.hipEvent_t

	mu     sync.RWMutex // Close (write) against calls on the event (read)
	closed bool
}

// use read-locks the event for op (Close waits for it), or fails when the
// event or its device is closed (then unlocked).
func (e *Event) use(op string) error {
	e.mu.RLock()
	if e.closed || e.d.closed.Load() {
		e.mu.RUnlock()
		return e.d.errClosed(op)
	}
	return nil
}

// Query reports whether the work before the event is done (hipEventQuery:
// hipSuccess done, hipErrorNotReady pending); any other code is the error
// of that work. An event never recorded is done.
func (e *Event) Query() (bool, error) {
	if err := e.use("Event.Query"); err != nil {
		return false, err
	}
	defer e.mu.RUnlock()
	err := e.d.lib.check(C.sthip_event_query(e.d.lib.c, e.d.dev(), e.e), "hipEventQuery")
	if code(err) == codeNotReady {
		return false, nil
	}
	return true, err
}

// Wait blocks the calling OS thread until the work before the event is
// done (hipEventSynchronize) and returns its error.
func (e *Event) Wait() error {
	if err := e.use("Event.Wait"); err != nil {
		return err
	}
	defer e.mu.RUnlock()
	return e.d.lib.check(C.sthip_event_sync(e.d.lib.c, e.d.dev(), e.e), "hipEventSynchronize")
}

// Close destroys the event. It waits for a Query or Wait in progress.
func (e *Event) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || e.d.closed.Load() {
		return e.d.errClosed("Event.Close")
	}
	e.closed = true
	e.d.mu.Lock()
	e.d.events--
	e.d.mu.Unlock()
	return e.d.lib.check(C.sthip_event_destroy(e.d.lib.c, e.d.dev(), e.e), "hipEventDestroy")
}

// sthip_seg is read straight from a []device.Seg: same size, same order.
var (
	_ = [1]struct{}{}[unsafe.Sizeof(device.Seg{})-C.sizeof_sthip_seg]
	_ = [1]struct{}{}[unsafe.Offsetof(device.Seg{}.Len)-8]
)

// The same-node ipc path copies through imported mappings with CopyDtoD.
var _ device.DtoD = (*Stream)(nil)
