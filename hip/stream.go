package hip

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

// Stream is a non-blocking HIP stream (device.Stream). Its methods may be
// called from any goroutine; calls on one stream are serialized.
type Stream struct {
	d *Device
	s C.hipStream_t

	gate vendorkit.Gate
	segs []device.Seg // merged segments of the chunk being enqueued; reused
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
func (s *Stream) begin(op string) error { return s.gate.Enter(&s.d.core, op) }

// end unlocks what begin locked.
func (s *Stream) end() { s.gate.Leave() }

func (s *Stream) move(gather bool, p device.Pinned, segs []device.Seg) error {
	return s.gate.Move(&s.d.core, gather, p, segs, s.enqueue)
}

// enqueue issues a checked move's copies, in one cgo call (the gate held).
func (s *Stream) enqueue(mv vendorkit.Move) error {
	gather, p, segs := mv.Gather, mv.Pinned, mv.Segs
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
	prep := "from"
	if !gather {
		prep = "to"
	}
	what := fmt.Sprintf("hipMemcpyAsync(%s, %d B %s %#x) [copy %d of %d, %s of %d B]", vendorkit.DirName(gather), sg.Len, prep, uint64(sg.Addr), i+1, len(s.segs), mv.Op, mv.Total)
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
	defer s.end()
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
	defer s.end()
	if err := e.use("Record(closed event)"); err != nil {
		return err
	}
	defer e.done()
	return s.d.lib.check(C.sthip_event_record(s.d.lib.c, s.d.dev(), e.e, s.s), "hipEventRecord")
}

// Synchronize waits for all enqueued work (hipStreamSynchronize) and
// returns its error. It blocks the calling OS thread.
func (s *Stream) Synchronize() error {
	if err := s.begin("Synchronize"); err != nil {
		return err
	}
	defer s.end()
	return s.d.lib.check(C.sthip_stream_sync(s.d.lib.c, s.d.dev(), s.s), "hipStreamSynchronize")
}

// Close waits for the stream's work and destroys it. Both are tried; the
// error reports either or both.
func (s *Stream) Close() error {
	return s.gate.Close(&s.d.core, "Stream.Close", &s.d.core.Streams, s.destroy)
}

// destroy is Close's part in the runtime (the gate held).
func (s *Stream) destroy() error {
	l := s.d.lib
	var errs []error
	if err := l.check(C.sthip_stream_sync(l.c, s.d.dev(), s.s), "hipStreamSynchronize(before destroy)"); err != nil {
		errs = append(errs, err)
	}
	if err := l.check(C.sthip_stream_destroy(l.c, s.d.dev(), s.s), "hipStreamDestroy"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Event is a HIP event created with DisableTiming (device.Event).
type Event struct {
	d    *Device
	e    C.hipEvent_t
	gate vendorkit.Gate // Close (Enter) against calls on the event (EnterShared)
}

// use read-locks the event for op (Close waits for it), or fails when the
// event or its device is closed (then unlocked); done unlocks.
func (e *Event) use(op string) error { return e.gate.EnterShared(&e.d.core, op) }

func (e *Event) done() { e.gate.LeaveShared() }

// Query reports whether the work before the event is done (hipEventQuery:
// hipSuccess done, hipErrorNotReady pending); any other code is the error
// of that work. An event never recorded is done.
func (e *Event) Query() (bool, error) {
	if err := e.use("Event.Query"); err != nil {
		return false, err
	}
	defer e.done()
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
	defer e.done()
	return e.d.lib.check(C.sthip_event_sync(e.d.lib.c, e.d.dev(), e.e), "hipEventSynchronize")
}

// Close destroys the event. It waits for a Query or Wait in progress.
func (e *Event) Close() error {
	return e.gate.Close(&e.d.core, "Event.Close", &e.d.core.Events, func() error {
		return e.d.lib.check(C.sthip_event_destroy(e.d.lib.c, e.d.dev(), e.e), "hipEventDestroy")
	})
}

// sthip_seg is read straight from a []device.Seg: same size, same order.
var (
	_ = [1]struct{}{}[unsafe.Sizeof(device.Seg{})-C.sizeof_sthip_seg]
	_ = [1]struct{}{}[unsafe.Offsetof(device.Seg{}.Len)-8]
)

// The same-node ipc path copies through imported mappings with CopyDtoD.
var _ device.DtoD = (*Stream)(nil)
