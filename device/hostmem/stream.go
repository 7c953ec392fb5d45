package hostmem

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stage-kv/stage/device"
)

// streamQueue is how many ops a stream holds before an enqueue blocks.
const streamQueue = 1024

type opKind uint8

const (
	opGather opKind = iota + 1
	opScatter
	opRecord
	opDtoD
)

func (k opKind) String() string {
	switch k {
	case opGather:
		return "gather"
	case opScatter:
		return "scatter"
	case opDtoD:
		return "dtod"
	}
	return "record"
}

// op is one queued command. It travels by value, so enqueueing allocates
// nothing but the pooled segment buffer.
type op struct {
	kind opKind
	host []byte  // gather: destination; scatter: source
	segs *segBuf // gather, scatter: a copy of the caller's segments
	ev   *event  // record
	gen  uint64  // record: the event's generation

	dst, src device.Addr // dtod
	n        uint64      // dtod
}

// segBuf holds a copy of a caller's []Seg while its op is queued: callers may
// reuse their slice as soon as Gather or Scatter returns. Buffers are pooled,
// so the steady state allocates nothing per call.
type segBuf struct{ s []device.Seg }

// maxPooledSegs bounds the buffers kept in the pool, so one huge segment list
// does not pin its memory forever.
const maxPooledSegs = 1 << 16

var segPool = sync.Pool{New: func() any { return new(segBuf) }}

func putSegs(b *segBuf) {
	if cap(b.s) > maxPooledSegs {
		return
	}
	b.s = b.s[:0]
	segPool.Put(b)
}

// stream is a FIFO of ops run by one worker goroutine.
type stream struct {
	d    *Dev
	id   uint64
	name string // "hostmem:0 stream 3"
	ops  chan op
	done chan struct{} // closed when the worker has exited

	// cmu guards closed and the send on ops: enqueuers hold it shared (also
	// while blocked on a full queue, which the worker drains without it),
	// Close holds it exclusive to close ops exactly once.
	cmu       sync.RWMutex
	closed    bool
	submitted atomic.Uint64 // ops counted before they are sent

	mu        sync.Mutex
	cond      sync.Cond // signalled on completed++ while waiters > 0
	completed uint64
	waiters   int
	err       error // sticky: the first failed copy's error
}

var _ device.Stream = (*stream)(nil)

func newStream(d *Dev, id uint64, queue int) *stream {
	s := &stream{
		d:    d,
		id:   id,
		name: fmt.Sprintf("%s stream %d", d.name, id),
		ops:  make(chan op, queue),
		done: make(chan struct{}),
	}
	s.cond.L = &s.mu
	go s.run()
	return s
}

// Gather enqueues a copy of segs, in order, into dst. Checks (nothing is
// enqueued when one fails): dst is a pinned buffer of hostmem (its device
// view is its host address), no segment wraps around the address space,
// and the lengths add up to dst.Len(). Empty segments are skipped. It blocks while the queue is
// full.
func (s *stream) Gather(dst device.Pinned, segs []device.Seg) error {
	return s.enqueueCopy(opGather, dst, segs)
}

// Scatter enqueues a copy of src into segs, in order; see Gather for the
// checks.
func (s *stream) Scatter(segs []device.Seg, src device.Pinned) error {
	return s.enqueueCopy(opScatter, src, segs)
}

func (s *stream) enqueueCopy(kind opKind, p device.Pinned, segs []device.Seg) error {
	if err := checkCopy(s.name, kind, p, segs); err != nil {
		return err
	}
	b := segPool.Get().(*segBuf)
	b.s = append(b.s[:0], segs...)
	if err := s.send(op{kind: kind, host: p.Host(), segs: b}); err != nil {
		putSegs(b)
		return err
	}
	return nil
}

// checkCopy checks a copy request before anything moves; what names the
// stream (or the synchronous path) in errors.
func checkCopy(what string, kind opKind, p device.Pinned, segs []device.Seg) error {
	h := p.Host()
	if len(h) == 0 || len(segs) == 0 {
		return fmt.Errorf("%s: %s of %d B in %d segments: nothing to copy", what, kind, len(h), len(segs))
	}
	if a := addrOf(h); p.DeviceAddr() != device.Addr(a) {
		return fmt.Errorf("%s: %s: pinned buffer at %#x has device view %#x; want one from hostmem AllocPinned (device view = host address): %w",
			what, kind, a, uint64(p.DeviceAddr()), device.ErrBadHandle)
	}
	var sum uint64
	for i, sg := range segs {
		if sg.Len == 0 {
			continue // nothing to move, as on every backend (devicetest checks it)
		}
		if sg.Addr == 0 {
			return fmt.Errorf("%s: %s: segment %d (%d B) is at address 0", what, kind, i, sg.Len)
		}
		if end := uint64(sg.Addr) + sg.Len; end < uint64(sg.Addr) || end-1 > uint64(math.MaxUint) {
			return fmt.Errorf("%s: %s: segment %d at %#x + %d B wraps around the address space", what, kind, i, uint64(sg.Addr), sg.Len)
		}
		if sum+sg.Len < sum {
			return fmt.Errorf("%s: %s: segment lengths overflow at segment %d", what, kind, i)
		}
		sum += sg.Len
	}
	if sum != uint64(len(h)) {
		return fmt.Errorf("%s: %s: %d segments add up to %d B, pinned buffer is %d B", what, kind, len(segs), sum, len(h))
	}
	return nil
}

// send queues o, blocking while the queue is full (backpressure).
func (s *stream) send(o op) error {
	s.cmu.RLock()
	defer s.cmu.RUnlock()
	if s.closed {
		return fmt.Errorf("%s: %s: stream %w", s.name, o.kind, device.ErrClosed)
	}
	s.submitted.Add(1)
	s.ops <- o
	return nil
}

// Record enqueues ev. ev must be an event of this device that is not pending
// (never recorded, or complete); recording a pending one is an error wrapping
// device.ErrNotReady.
func (s *stream) Record(ev device.Event) error {
	e, ok := ev.(*event)
	if !ok || e.d != s.d {
		return fmt.Errorf("%s: record %T: not an event of this device: %w", s.name, ev, device.ErrBadHandle)
	}
	s.cmu.RLock()
	defer s.cmu.RUnlock()
	if s.closed {
		return fmt.Errorf("%s: record: stream %w", s.name, device.ErrClosed)
	}
	gen, err := e.arm()
	if err != nil {
		return fmt.Errorf("%s: record: %w", s.name, err)
	}
	// Cannot fail now: closed is false and stays so while cmu is held.
	s.submitted.Add(1)
	s.ops <- op{kind: opRecord, ev: e, gen: gen}
	return nil
}

// Synchronize waits for every op enqueued before it and returns the
// stream's sticky error, if any.
func (s *stream) Synchronize() error {
	s.cmu.RLock()
	closed := s.closed
	target := s.submitted.Load()
	s.cmu.RUnlock()
	if closed {
		return fmt.Errorf("%s: synchronize: stream %w", s.name, device.ErrClosed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiters++
	for s.completed < target {
		s.cond.Wait()
	}
	s.waiters--
	return s.err
}

// Close runs what is queued, stops the worker and waits for it. A second
// Close returns an error wrapping device.ErrClosed.
func (s *stream) Close() error {
	s.cmu.Lock()
	if s.closed {
		s.cmu.Unlock()
		return fmt.Errorf("%s: close: stream %w", s.name, device.ErrClosed)
	}
	s.closed = true
	close(s.ops)
	s.cmu.Unlock()
	<-s.done
	s.d.mu.Lock()
	delete(s.d.streams, s)
	s.d.mu.Unlock()
	return nil
}

// run is the worker: it executes ops in FIFO order until ops is closed and
// drained.
func (s *stream) run() {
	defer close(s.done)
	var sticky error // the worker's copy of s.err
	for o := range s.ops {
		switch o.kind {
		case opGather, opScatter, opDtoD:
			if sticky != nil {
				s.d.skipped.Add(1)
			} else if err := s.exec(&o); err != nil {
				sticky = err
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
			}
			if o.segs != nil {
				putSegs(o.segs)
			}
		case opRecord:
			o.ev.complete(o.gen, sticky)
		}
		s.mu.Lock()
		s.completed++
		if s.waiters > 0 {
			s.cond.Broadcast()
		}
		s.mu.Unlock()
	}
}

// copy moves the bytes of one gather or scatter, then waits out the rest of
// the time the speed model gives it.
func (s *stream) copy(o *op) error { return s.d.move(s.name, o.kind, o.host, o.segs.s) }

// move copies between host and the emulated device memory of segs, with
// the fault injection and the bandwidth/latency model of the device; what
// names the caller (a stream, or the synchronous path) in errors.
func (d *Dev) move(what string, kind opKind, host []byte, segs []device.Seg) error {
	n := uint64(len(host))
	if d.injectFault() {
		d.failed.Add(1)
		return fmt.Errorf("%s: %s of %d B in %d segments: %w", what, kind, n, len(segs), ErrInjected)
	}
	start := time.Now()
	if err := copyGuarded(kind, host, segs); err != nil {
		d.failed.Add(1)
		return fmt.Errorf("%s: %w", what, err)
	}
	if d.bw > 0 || d.lat > 0 {
		l := &d.d2h
		if kind == opScatter {
			l = &d.h2d
		}
		end := start
		if d.bw > 0 {
			end = l.reserve(start, time.Duration(float64(n)/d.bw*float64(time.Second)))
		}
		waitUntil(end.Add(d.lat))
	}
	d.copies.Add(1)
	d.bytes.Add(n)
	return nil
}

// spinBelow is the remaining wait under which waitUntil spins instead of
// sleeping: timers are coarser than the short copies the model paces.
const spinBelow = 50 * time.Microsecond

func waitUntil(t time.Time) {
	for {
		left := time.Until(t)
		switch {
		case left <= 0:
			return
		case left > spinBelow:
			time.Sleep(left - spinBelow/2)
		default:
			runtime.Gosched()
		}
	}
}
