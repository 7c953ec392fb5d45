package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/stage-kv/stage/cuda/kernels"
	"github.com/stage-kv/stage/device"
)

// Descriptor ring sizing (per stream, kernel mode).
const (
	ringSlotDescs = 1024     // descriptors per launch: 24 KiB of pinned memory
	ringMaxSlots  = 16       // launches in flight per stream before Gather waits
	maxDescBytes  = 64 << 10 // longer segments are split so blocks share the work
)

// Stream is a non-blocking CUDA stream (device.Stream). Its methods may be
// called from any goroutine; calls on one stream are serialized.
type Stream struct {
	d *Device
	s C.CUstream

	mu     sync.Mutex
	closed bool
	ring   *descRing
	slots  []slotRes
	sc     *C.stage_scratch

	stridedLaunches int // launches of the strided kernel, for tests
}

type slotRes struct {
	host unsafe.Pointer
	ev   C.CUevent
}

// Gather enqueues a copy of segs, in order, into dst contiguously. One
// segment takes one cuMemcpyDtoHAsync; several take the device's copy mode
// (one kernel launch writing through dst.DeviceAddr(), one batched copy, or
// one copy per segment). segs may be reused when Gather returns.
func (s *Stream) Gather(dst device.Pinned, segs []device.Seg) error {
	return s.move(true, dst, segs)
}

// Scatter enqueues a copy of src, contiguously, into segs (see Gather).
func (s *Stream) Scatter(segs []device.Seg, src device.Pinned) error {
	return s.move(false, src, segs)
}

func opName(gather bool) string {
	if gather {
		return "Gather"
	}
	return "Scatter"
}

func (s *Stream) move(gather bool, p device.Pinned, segs []device.Seg) error {
	var total uint64
	nz, last := 0, -1
	for i, sg := range segs {
		if sg.Len == 0 {
			continue
		}
		if total+sg.Len < total || uint64(sg.Addr)+sg.Len < uint64(sg.Addr) {
			return fmt.Errorf("cuda: %s: %s: segment %d (%#x, %d B) overflows", s.d, opName(gather), i, sg.Addr, sg.Len)
		}
		total += sg.Len
		nz++
		last = i
	}
	if total != uint64(p.Len()) {
		return fmt.Errorf("cuda: %s: %s: segments add up to %d B, pinned buffer is %d B", s.d, opName(gather), total, p.Len())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.d.closed.Load() {
		return s.d.errClosed(opName(gather))
	}
	if total == 0 {
		return nil
	}
	host := uintptr(unsafe.Pointer(&p.Host()[0]))
	if nz == 1 {
		sg := segs[last]
		return s.copy1(gather, host, sg.Addr, sg.Len)
	}
	mode := s.d.mode
	if mode == CopyKernel && p.DeviceAddr() == 0 {
		mode = s.d.fallback
	}
	switch mode {
	case CopyKernel:
		return s.kernelMove(gather, uint64(p.DeviceAddr()), segs)
	default:
		return s.listMove(gather, mode, host, segs, nz, total)
	}
}

func (s *Stream) copy1(gather bool, host uintptr, a device.Addr, n uint64) error {
	l := s.d.lib
	if gather {
		if rc := C.stage_dtoh_async(l.c, s.d.ctx, C.uintptr_t(host), C.CUdeviceptr(a), C.size_t(n), s.s); rc != 0 {
			return l.check(rc, "cuMemcpyDtoHAsync(%d B from %#x)", n, uint64(a))
		}
		return nil
	}
	if rc := C.stage_htod_async(l.c, s.d.ctx, C.CUdeviceptr(a), C.uintptr_t(host), C.size_t(n), s.s); rc != 0 {
		return l.check(rc, "cuMemcpyHtoDAsync(%d B to %#x)", n, uint64(a))
	}
	return nil
}

// listMove fills the stream's C scratch arrays and issues one batched copy,
// or one copy per segment from a single cgo call.
func (s *Stream) listMove(gather bool, mode CopyMode, host uintptr, segs []device.Seg, nz int, total uint64) error {
	l := s.d.lib
	if s.sc == nil {
		s.sc = C.stage_scratch_new()
		if s.sc == nil {
			return fmt.Errorf("cuda: %s: %s: out of host memory for copy descriptors", s.d, opName(gather))
		}
	}
	if C.stage_scratch_reserve(s.sc, C.size_t(nz)) != 0 {
		return fmt.Errorf("cuda: %s: %s: out of host memory for %d copy descriptors", s.d, opName(gather), nz)
	}
	dsts := unsafe.Slice(s.sc.dsts, nz)
	srcs := unsafe.Slice(s.sc.srcs, nz)
	sizes := unsafe.Slice(s.sc.sizes, nz)
	off := uint64(host)
	i := 0
	for _, sg := range segs {
		if sg.Len == 0 {
			continue
		}
		if gather {
			dsts[i], srcs[i] = C.CUdeviceptr(off), C.CUdeviceptr(sg.Addr)
		} else {
			dsts[i], srcs[i] = C.CUdeviceptr(sg.Addr), C.CUdeviceptr(off)
		}
		sizes[i] = C.size_t(sg.Len)
		off += sg.Len
		i++
	}
	if mode == CopyBatch {
		if rc := C.stage_batch(l.c, s.d.ctx, s.sc, C.size_t(nz), s.s); rc != 0 {
			return l.check(rc, "cuMemcpyBatchAsync(%d copies, %d B, %s)%s", nz, total, dirName(gather), s.failAt(nz))
		}
		return nil
	}
	dir := C.int(1)
	if gather {
		dir = 0
	}
	if rc := C.stage_percopy(l.c, s.d.ctx, dir, s.sc, C.size_t(nz), s.s); rc != 0 {
		k := int(s.sc.fail)
		if gather {
			return l.check(rc, "cuMemcpyDtoHAsync(%d B from %#x) [copy %d of %d]", uint64(sizes[k]), uint64(srcs[k]), k+1, nz)
		}
		return l.check(rc, "cuMemcpyHtoDAsync(%d B to %#x) [copy %d of %d]", uint64(sizes[k]), uint64(dsts[k]), k+1, nz)
	}
	return nil
}

func (s *Stream) failAt(n int) string {
	k := uint64(s.sc.fail)
	if k >= uint64(n) {
		return ""
	}
	srcs := unsafe.Slice(s.sc.srcs, n)
	dsts := unsafe.Slice(s.sc.dsts, n)
	sizes := unsafe.Slice(s.sc.sizes, n)
	return fmt.Sprintf(" [copy %d: %d B %#x -> %#x]", k+1, uint64(sizes[k]), uint64(srcs[k]), uint64(dsts[k]))
}

func dirName(gather bool) string {
	if gather {
		return "D2H"
	}
	return "H2D"
}

// kernelMove writes descriptors into ring slots (host-mapped, so the kernel
// reads them where they are) and launches a copy kernel once per slot,
// recording the slot's event behind each launch. Where the device has the
// strided kernel, each slot's segments are first compressed into strided
// descriptors; a slot whose segments compress less than stridedMinRatio to
// one is refilled with plain descriptors instead.
func (s *Stream) kernelMove(gather bool, pinned uint64, segs []device.Seg) error {
	si, so := 0, uint64(0)
	return s.kernelRun(dirName(gather)+" segments",
		func() bool { return si < len(segs) },
		func(sl *ringSlot) (n int, strided bool) {
			if s.d.fnStrided != nil {
				n, pieces, nsi, nso, np := compressSegs(sl.strided, segs, si, so, pinned, gather, s.d.stridedMax)
				if n > 0 && pieces >= stridedMinRatio*n {
					si, so, pinned = nsi, nso, np
					s.stridedLaunches++
					return n, true
				}
			}
			n, si, so, pinned = fillDescs(sl.descs, segs, si, so, pinned, gather, maxDescBytes)
			return n, false
		})
}

// kernelRun launches a copy kernel once per ring slot while more says
// there is work, fill writing each slot's descriptors (n == 0: nothing
// left; strided: they are strided descriptors), and records the slot's
// event behind each launch.
func (s *Stream) kernelRun(what string, more func() bool, fill func(*ringSlot) (n int, strided bool)) error {
	l := s.d.lib
	if s.ring == nil {
		s.ring = newDescRing(slotBackend{s}, ringSlotDescs, ringMaxSlots)
	}
	for more() {
		slot, err := s.ring.acquire()
		if err != nil {
			return err
		}
		n, strided := fill(slot)
		if n == 0 {
			s.ring.putBack(slot)
			return nil
		}
		fn, name := s.d.fn, kernels.CopyFunc
		if strided {
			fn, name = s.d.fnStrided, kernels.StridedFunc
		}
		res := C.stage_launch_copy(l.c, s.d.ctx, fn, C.CUdeviceptr(slot.dev), C.uint(n),
			C.uint(n), C.uint(kernels.CopyBlock), s.s, s.slots[slot.id].ev)
		if res.rc != 0 {
			if res.step == 0 {
				s.ring.putBack(slot)
				return l.check(res.rc, "cuLaunchKernel(%s, %d %s)", name, n, what)
			}
			// The kernel is queued but its slot has no event to say when it
			// is done: wait for the stream before the slot can be reused.
			C.stage_stream_sync(l.c, s.d.ctx, s.s)
			s.ring.putBack(slot)
			return l.check(res.rc, "cuEventRecord(after %s)", name)
		}
		s.ring.submit(slot)
	}
	return nil
}

// slotBackend gives a stream's descriptor ring its device operations.
type slotBackend struct{ s *Stream }

func (b slotBackend) alloc(id, n int) (*ringSlot, error) {
	s := b.s
	l := s.d.lib
	bytes := n * kernels.DescSize
	var host unsafe.Pointer
	var dev C.CUdeviceptr
	if rc := C.stage_host_alloc(l.c, s.d.ctx, C.size_t(bytes), memHostAllocPortable|memHostAllocDeviceMap, &host, &dev); rc != 0 {
		return nil, l.check(rc, "cuMemHostAlloc(%d B, descriptor ring)", bytes)
	}
	var ev C.CUevent
	if rc := C.stage_event_create(l.c, s.d.ctx, eventDisableTiming, &ev); rc != 0 {
		C.stage_host_free(l.c, s.d.ctx, host)
		return nil, l.check(rc, "cuEventCreate(descriptor ring)")
	}
	for len(s.slots) <= id {
		s.slots = append(s.slots, slotRes{})
	}
	s.slots[id] = slotRes{host: host, ev: ev}
	return &ringSlot{id: id, descs: unsafe.Slice((*desc)(host), n),
		strided: unsafe.Slice((*sdesc)(host), bytes/kernels.StridedDescSize), dev: uint64(dev)}, nil
}

func (b slotBackend) done(sl *ringSlot) (bool, error) {
	s := b.s
	rc := C.stage_event_query(s.d.lib.c, s.d.ctx, s.slots[sl.id].ev)
	switch rc {
	case 0:
		return true, nil
	case codeNotReady:
		return false, nil
	}
	return true, s.d.lib.check(rc, "cuEventQuery(descriptor ring slot %d)", sl.id)
}

func (b slotBackend) wait(sl *ringSlot) error {
	s := b.s
	if rc := C.stage_event_sync(s.d.lib.c, s.d.ctx, s.slots[sl.id].ev); rc != 0 {
		return s.d.lib.check(rc, "cuEventSynchronize(descriptor ring slot %d)", sl.id)
	}
	return nil
}

func (b slotBackend) free(sl *ringSlot) error {
	s := b.s
	l := s.d.lib
	r := s.slots[sl.id]
	s.slots[sl.id] = slotRes{}
	var first error
	if rc := C.stage_event_destroy(l.c, s.d.ctx, r.ev); rc != 0 {
		first = l.check(rc, "cuEventDestroy(descriptor ring slot %d)", sl.id)
	}
	if rc := C.stage_host_free(l.c, s.d.ctx, r.host); rc != 0 && first == nil {
		first = l.check(rc, "cuMemFreeHost(descriptor ring slot %d)", sl.id)
	}
	return first
}

// Record enqueues ev, an Event of the same device.
func (s *Stream) Record(ev device.Event) error {
	e, ok := ev.(*Event)
	if !ok || e.d != s.d {
		return fmt.Errorf("cuda: %s: Record: event %T is not an event of this device", s.d, ev)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.d.closed.Load() {
		return s.d.errClosed("Record")
	}
	if rc := C.stage_event_record(s.d.lib.c, s.d.ctx, e.e, s.s); rc != 0 {
		return s.d.lib.check(rc, "cuEventRecord")
	}
	return nil
}

// Synchronize waits for all enqueued work (cuStreamSynchronize). It blocks
// the calling OS thread.
func (s *Stream) Synchronize() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.d.closed.Load() {
		return s.d.errClosed("Synchronize")
	}
	if rc := C.stage_stream_sync(s.d.lib.c, s.d.ctx, s.s); rc != 0 {
		return s.d.lib.check(rc, "cuStreamSynchronize")
	}
	return nil
}

// Close waits for the stream's work, frees its descriptor ring and scratch
// and destroys it.
func (s *Stream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.d.closed.Load() {
		return s.d.errClosed("Stream.Close")
	}
	s.closed = true
	l := s.d.lib
	var first error
	if rc := C.stage_stream_sync(l.c, s.d.ctx, s.s); rc != 0 {
		first = l.check(rc, "cuStreamSynchronize(before destroy)")
	}
	if s.ring != nil {
		if err := s.ring.close(); err != nil && first == nil {
			first = err
		}
		s.ring = nil
	}
	if s.sc != nil {
		C.stage_scratch_free(s.sc)
		s.sc = nil
	}
	if rc := C.stage_stream_destroy(l.c, s.d.ctx, s.s); rc != 0 && first == nil {
		first = l.check(rc, "cuStreamDestroy")
	}
	s.d.mu.Lock()
	s.d.streams--
	s.d.mu.Unlock()
	return first
}

// Event is a CUDA event without timing (device.Event).
type Event struct {
	d      *Device
	e      C.CUevent
	mu     sync.Mutex
	closed bool
}

// Query reports whether the work before the event is done (cuEventQuery;
// CUDA_ERROR_NOT_READY means not yet) and that work's error if it failed.
func (e *Event) Query() (bool, error) {
	if e.d.closed.Load() {
		return false, e.d.errClosed("Event.Query")
	}
	rc := C.stage_event_query(e.d.lib.c, e.d.ctx, e.e)
	switch rc {
	case 0:
		return true, nil
	case codeNotReady:
		return false, nil
	}
	return true, e.d.lib.check(rc, "cuEventQuery")
}

// Wait blocks the calling OS thread until the work before the event is done
// and returns its error: cuEventSynchronize, after polling for a while
// when the device waits in WaitHybrid mode (see EventWait).
func (e *Event) Wait() error {
	if e.d.closed.Load() {
		return e.d.errClosed("Event.Wait")
	}
	if rc := C.stage_event_wait(e.d.lib.c, e.d.ctx, e.e, C.int64_t(e.d.wait.spin())); rc != 0 {
		return e.d.lib.check(rc, "cuEventSynchronize (wait %s)", e.d.wait)
	}
	return nil
}

// Close destroys the event.
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
	if rc := C.stage_event_destroy(e.d.lib.c, e.d.ctx, e.e); rc != 0 {
		return e.d.lib.check(rc, "cuEventDestroy")
	}
	return nil
}

// The same-node paths: ipc copies with CopyDtoD, shm pins the shared ring.
var (
	_ device.DtoD           = (*Stream)(nil)
	_ device.HostRegisterer = (*Device)(nil)
)
