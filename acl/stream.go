package acl

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

// Stream tuning.
const (
	ringAlign     = 64 << 10              // pack ring halves are rounded up to this
	closeSyncMS   = 30_000                // Close waits this long for queued work
	spinPolls     = 64                    // Wait polls this often before it sleeps
	firstSleep    = 10 * time.Microsecond // then sleeps double from here...
	maxSleep      = 500 * time.Microsecond
	probeAfter    = 20 * time.Millisecond // ...and after this, also asks the stream
	probeEvery    = 20 * time.Millisecond
	probeTimeout  = 2 // ms: aclrtSynchronizeStreamWithTimeout of one probe
	eventComplete = 1 // ACL_EVENT_RECORDED_STATUS_COMPLETE (NOT_READY is 0)
)

// Stream is an ACL stream (device.Stream). Its methods may be called from
// any goroutine; calls on one stream are serialized.
type Stream struct {
	d *Device
	s C.aclrtStream

	gate vendorkit.Gate // enqueue, Synchronize, Close; closed: also under life
	life sync.RWMutex   // Close (write) against event probes (read)
	sc   *C.stacl_scratch

	// Pack mode: a device buffer of two halves; consecutive chunks use
	// alternate halves.
	ring     uint64
	ringHalf uint64
	ringNext uint64

	fail atomic.Pointer[failure] // first error a synchronize or probe saw
}

type failure struct{ err error }

// failed returns the stream's sticky error, or nil.
func (s *Stream) failed() error {
	if f := s.fail.Load(); f != nil {
		return f.err
	}
	return nil
}

func (s *Stream) setFailed(err error) { s.fail.CompareAndSwap(nil, &failure{err}) }

// Gather enqueues a copy of segs, in order, into dst contiguously (device to
// host). Adjacent segments are merged first; what is left as one range takes
// one aclrtMemcpyAsync D2H, several take the device's copy mode (batch:
// one aclrtMemcpyBatchAsync; pack: a D2D per block into the stream's device
// ring, then one D2H of the packed chunk; percopy: a D2H per block). Every
// copy uses dst's host address. segs may be reused when Gather returns.
func (s *Stream) Gather(dst device.Pinned, segs []device.Seg) error {
	return s.move(true, dst, segs)
}

// Scatter enqueues a copy of src, contiguously, into segs (host to device);
// pack mode is one H2D into the ring, then a D2D per block (see Gather).
func (s *Stream) Scatter(segs []device.Seg, src device.Pinned) error {
	return s.move(false, src, segs)
}

func (s *Stream) move(gather bool, p device.Pinned, segs []device.Seg) error {
	return s.gate.Move(&s.d.core, gather, p, segs, s.enqueue)
}

// enqueue issues a checked move's copies (the gate held).
func (s *Stream) enqueue(mv vendorkit.Move) error {
	gather, p, segs, total := mv.Gather, mv.Pinned, mv.Segs, mv.Total
	if s.sc == nil {
		if s.sc = C.stacl_scratch_new(); s.sc == nil {
			return s.d.core.Errorf("%s: out of host memory for copy descriptors", mv.Op)
		}
	}
	if C.stacl_scratch_reserve(s.sc, C.size_t(len(segs))) != 0 {
		return s.d.core.Errorf("%s: out of host memory for %d copy descriptors", mv.Op, len(segs))
	}
	n := coalesce(unsafe.Slice((*uint64)(unsafe.Pointer(s.sc.dev)), len(segs)),
		unsafe.Slice((*uint64)(unsafe.Pointer(s.sc.len)), len(segs)), segs)
	host := uintptr(unsafe.Pointer(&p.Host()[0]))
	mode := s.d.copyMode()
	if n == 1 {
		mode = CopyPerCopy // one range: one plain copy
	}
	for {
		var ring uint64
		if mode == CopyPack {
			var err error
			if ring, err = s.ringFor(total); err != nil {
				return err
			}
		}
		g := C.int(0)
		if gather {
			g = 1
		}
		r := C.stacl_move(s.d.lib.c, s.d.ctx, s.sc, C.size_t(n), modeC(mode), g, C.uintptr_t(host),
			C.uintptr_t(ring), C.uint32_t(s.d.Ordinal()), s.s)
		if r.rc == 0 {
			return nil
		}
		err := s.moveError(r, gather, mode, n, total)
		if mode == CopyBatch && r.step == C.STACL_STEP_BATCH && errors.Is(err, device.ErrNotSupported) {
			// The library exports the call but this runtime or device
			// refuses it: pack from now on, starting with this chunk
			// (nothing of it was queued).
			if !s.d.batchOff.Swap(true) {
				s.d.logf("acl: %s: batched copies refused, copy mode pack from now on: %v", s.d, err)
			}
			mode = CopyPack
			continue
		}
		return err
	}
}

// coalesce writes segs into dev/lens, merging a segment into the previous
// one when it starts where that one ends (the pinned side is contiguous
// anyway), skipping empty ones. It returns how many ranges it wrote.
func coalesce(dev, lens []uint64, segs []device.Seg) int {
	n := 0
	for _, sg := range segs {
		if sg.Len == 0 {
			continue
		}
		if n > 0 && dev[n-1]+lens[n-1] == uint64(sg.Addr) {
			lens[n-1] += sg.Len
			continue
		}
		dev[n], lens[n] = uint64(sg.Addr), sg.Len
		n++
	}
	return n
}

func modeC(m CopyMode) C.int {
	switch m {
	case CopyBatch:
		return C.STACL_BATCH
	case CopyPack:
		return C.STACL_PACK
	}
	return C.STACL_PERCOPY
}

// moveError names the call of stacl_move that failed, with its values.
func (s *Stream) moveError(r C.stacl_move_ret, gather bool, mode CopyMode, n int, total uint64) error {
	l := s.d.lib
	ret := C.stacl_ret{rc: r.rc, msg: r.msg}
	idx := int(r.idx)
	var op string
	switch r.step {
	case C.STACL_STEP_CTX:
		op = fmt.Sprintf("aclrtSetCurrentContext(%s)", s.d)
	case C.STACL_STEP_BATCH:
		op = fmt.Sprintf("aclrtMemcpyBatchAsync(%d copies, %d B, %s)", n, total, vendorkit.DirName(gather))
		if r.idx != C.size_t(^uint(0)) && idx < n {
			op += fmt.Sprintf(" [copy %d of %d: %d B at %#x]", idx+1, n, s.lenAt(idx), s.devAt(idx))
		}
	case C.STACL_STEP_BULK:
		if gather {
			op = fmt.Sprintf("aclrtMemcpyAsync(D2H, %d B packed chunk from the device ring)", total)
		} else {
			op = fmt.Sprintf("aclrtMemcpyAsync(H2D, %d B chunk into the device ring)", total)
		}
	default:
		kind := vendorkit.DirName(gather)
		if mode == CopyPack {
			kind = "D2D pack"
			if !gather {
				kind = "D2D unpack"
			}
		}
		if gather {
			op = fmt.Sprintf("aclrtMemcpyAsync(%s, %d B from %#x) [block %d of %d]", kind, s.lenAt(idx), s.devAt(idx), idx+1, n)
		} else {
			op = fmt.Sprintf("aclrtMemcpyAsync(%s, %d B to %#x) [block %d of %d]", kind, s.lenAt(idx), s.devAt(idx), idx+1, n)
		}
	}
	if r.drained != 0 {
		op += " (copies already queued were waited for)"
	}
	return l.check(ret, "%s", op)
}

func (s *Stream) devAt(i int) uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(s.sc.dev)), i+1)[i]
}
func (s *Stream) lenAt(i int) uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(s.sc.len)), i+1)[i]
}

// ringFor returns the device address of the ring half the next packed
// chunk of total bytes uses, growing the ring when total does not fit (the
// old one is freed after the stream drained). Tasks of one stream run in
// order, so the D2D copies that refill a half run after the D2H that read
// it: stream order is what makes reuse safe. Alternating halves keeps two
// consecutive chunks on distinct bytes.
func (s *Stream) ringFor(total uint64) (uint64, error) {
	l := s.d.lib
	if total > s.ringHalf {
		if s.ring != 0 {
			if err := l.check(C.stacl_stream_sync(l.c, s.d.ctx, s.s, -1), "aclrtSynchronizeStream(before growing the pack ring)"); err != nil {
				s.setFailed(err)
				return 0, err
			}
			if err := l.check(C.stacl_free(l.c, s.d.ctx, C.uintptr_t(s.ring)), "aclrtFree(pack ring %#x)", s.ring); err != nil {
				return 0, err
			}
			s.ring, s.ringHalf = 0, 0
		}
		half := (total + ringAlign - 1) / ringAlign * ringAlign
		var p C.uintptr_t
		if err := l.check(C.stacl_malloc(l.c, s.d.ctx, C.size_t(2*half), mallocHugeFirst, &p), "aclrtMalloc(%d B pack ring, HUGE_FIRST)", 2*half); err != nil {
			return 0, fmt.Errorf("%w; pack mode needs 2 x slot size of device memory per copy stream (set device.acl.copy_mode to batch or percopy to avoid it)", err)
		}
		s.ring, s.ringHalf = uint64(p), half
	}
	off := (s.ringNext & 1) * s.ringHalf
	s.ringNext++
	return s.ring + off, nil
}

// Record enqueues ev, an Event of the same device.
func (s *Stream) Record(ev device.Event) error {
	e, ok := ev.(*Event)
	if !ok || e.d != s.d {
		return fmt.Errorf("acl: %s: Record: event %T is not an event of this device", s.d, ev)
	}
	if err := s.gate.Enter(&s.d.core, "Record"); err != nil {
		return err
	}
	defer s.gate.Leave()
	if err := e.gate.Enter(&s.d.core, "Record(closed event)"); err != nil {
		return err
	}
	defer e.gate.Leave()
	if err := s.d.lib.check(C.stacl_event_record(s.d.lib.c, s.d.ctx, e.e, s.s), "aclrtRecordEvent"); err != nil {
		return err
	}
	e.on.Store(s)
	return nil
}

// Synchronize waits for all enqueued work (aclrtSynchronizeStreamWithTimeout,
// -1) and returns the stream's error. It blocks the calling OS thread.
func (s *Stream) Synchronize() error {
	if err := s.gate.Enter(&s.d.core, "Synchronize"); err != nil {
		return err
	}
	defer s.gate.Leave()
	if err := s.d.lib.check(C.stacl_stream_sync(s.d.lib.c, s.d.ctx, s.s, -1), "aclrtSynchronizeStream"); err != nil {
		s.setFailed(err)
		return err
	}
	return nil
}

// probe asks the stream whether it still runs, drained, or failed, waiting
// at most probeTimeout ms. done reports that the waiting is over, with err
// the stream's failure, if any.
func (s *Stream) probe() (done bool, err error) {
	s.life.RLock()
	defer s.life.RUnlock()
	if s.gate.IsClosed() {
		return true, nil // Close drained it
	}
	err = s.d.lib.check(C.stacl_stream_sync(s.d.lib.c, s.d.ctx, s.s, probeTimeout), "aclrtSynchronizeStreamWithTimeout(%d ms)", probeTimeout)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, device.ErrNotReady):
		return false, nil
	}
	s.setFailed(err)
	return true, err
}

// Close waits (up to 30 s) for the stream's work, frees its pack ring and
// scratch, and destroys it.
func (s *Stream) Close() error {
	if err := s.gate.Enter(&s.d.core, "Stream.Close"); err != nil {
		return err
	}
	defer s.gate.Leave()
	s.life.Lock()
	defer s.life.Unlock()
	s.gate.MarkClosed()
	l := s.d.lib
	var errs []error
	if err := l.check(C.stacl_stream_sync(l.c, s.d.ctx, s.s, closeSyncMS), "aclrtSynchronizeStreamWithTimeout(%d ms, before destroy)", closeSyncMS); err != nil {
		s.setFailed(err)
		if s.failed() != err {
			err = fmt.Errorf("%w (the stream had failed before: %v)", err, s.failed())
		}
		errs = append(errs, err)
	}
	if s.ring != 0 {
		if err := l.check(C.stacl_free(l.c, s.d.ctx, C.uintptr_t(s.ring)), "aclrtFree(pack ring %#x)", s.ring); err != nil {
			errs = append(errs, err)
		}
		s.ring, s.ringHalf = 0, 0
	}
	if s.sc != nil {
		C.stacl_scratch_free(s.sc)
		s.sc = nil
	}
	if err := l.check(C.stacl_stream_destroy(l.c, s.d.ctx, s.s), "aclrtDestroyStream"); err != nil {
		errs = append(errs, err)
	}
	s.d.core.Count(&s.d.core.Streams, -1)
	return errors.Join(errs...)
}

// Event is an ACL event (device.Event).
//
// Completion is read with aclrtQueryEventStatus, whose status is
// ACL_EVENT_RECORDED_STATUS_NOT_READY = 0 / COMPLETE = 1. The older
// aclrtQueryEvent reports aclrtEventStatus, where COMPLETE = 0 and
// NOT_READY = 1: the inverse. It is deliberately not bound; do not swap it
// in.
type Event struct {
	d    *Device
	e    C.aclrtEvent
	gate vendorkit.Gate
	on   atomic.Pointer[Stream] // stream of the last Record; nil if never recorded
}

// status reads the event's recorded status.
func (e *Event) status() (bool, error) {
	var st C.int32_t
	if err := e.d.lib.check(C.stacl_event_status(e.d.lib.c, e.d.ctx, e.e, &st), "aclrtQueryEventStatus"); err != nil {
		return true, err
	}
	return st == eventComplete, nil
}

// Query reports whether the work before the event is done. ACL reports an
// event whose work failed as NOT_READY forever; Query returns that work's
// error once the event's stream has been seen failed (by Wait, Synchronize
// or Close), and (false, nil) until then. An event never recorded is done.
func (e *Event) Query() (bool, error) {
	if err := e.d.core.Check("Event.Query"); err != nil {
		return false, err
	}
	s := e.on.Load()
	if s == nil {
		return true, nil
	}
	done, err := e.status()
	if done || err != nil {
		return true, err
	}
	if f := s.failed(); f != nil {
		return true, f
	}
	return false, nil
}

// Wait blocks until the work before the event is done and returns its
// error. It polls aclrtQueryEventStatus: a few times at once, then with
// sleeps growing from 10 us to 500 us. Because a failed copy leaves its
// events NOT_READY for good, a Wait that has lasted 20 ms also asks the
// stream every 20 ms (aclrtSynchronizeStreamWithTimeout, 2 ms): a failed
// stream ends the Wait with the stream's error; a drained one with the
// event still not complete ends it with an error saying so.
func (e *Event) Wait() error {
	start := time.Now()
	nextProbe := start.Add(probeAfter)
	sleep := firstSleep
	for polls := 0; ; polls++ {
		done, err := e.Query()
		if done {
			return err
		}
		if polls < spinPolls {
			runtime.Gosched()
			continue
		}
		if now := time.Now(); now.After(nextProbe) {
			s := e.on.Load()
			if done, err := s.probe(); done {
				if err != nil {
					return err
				}
				if ok, err := e.status(); ok || err != nil {
					return err
				}
				return e.d.core.Errorf("event still not complete after its stream drained (waited %v): a task before it failed or was dropped", time.Since(start).Round(time.Millisecond))
			}
			nextProbe = now.Add(probeEvery)
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, maxSleep)
	}
}

// Close destroys the event.
func (e *Event) Close() error {
	return e.gate.Close(&e.d.core, "Event.Close", &e.d.core.Events, func() error {
		return e.d.lib.check(C.stacl_event_destroy(e.d.lib.c, e.d.ctx, e.e), "aclrtDestroyEvent")
	})
}
