package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/stage-kv/stage/cuda/kernels"
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
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

	gate  vendorkit.Gate
	ring  *descRing
	slots []slotRes
	sc    *C.stage_scratch

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

func (s *Stream) move(gather bool, p device.Pinned, segs []device.Seg) error {
	return s.gate.Move(&s.d.core, gather, p, segs, s.enqueue)
}

// enqueue issues a checked move's copies (the gate held).
func (s *Stream) enqueue(mv vendorkit.Move) error {
	gather, p, segs := mv.Gather, mv.Pinned, mv.Segs
	host := uintptr(unsafe.Pointer(&p.Host()[0]))
	if mv.NonEmpty == 1 {
		sg := segs[mv.Last]
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
		return s.listMove(gather, mode, host, segs, mv.NonEmpty, mv.Total)
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
			return s.d.core.Errorf("%s: out of host memory for copy descriptors", vendorkit.OpName(gather))
		}
	}
	if C.stage_scratch_reserve(s.sc, C.size_t(nz)) != 0 {
		return s.d.core.Errorf("%s: out of host memory for %d copy descriptors", vendorkit.OpName(gather), nz)
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
			return l.check(rc, "cuMemcpyBatchAsync(%d copies, %d B, %s)%s", nz, total, vendorkit.DirName(gather), s.failAt(nz))
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

// kernelMove writes descriptors into ring slots (host-mapped, so the kernel
// reads them where they are) and launches a copy kernel once per slot,
// recording the slot's event behind each launch. Where the device has the
// strided kernel, each slot's segments are first compressed into strided
// descriptors; a slot whose segments compress less than stridedMinRatio to
// one is refilled with plain descriptors instead.
func (s *Stream) kernelMove(gather bool, pinned uint64, segs []device.Seg) error {
	si, so := 0, uint64(0)
	return s.kernelRun(vendorkit.DirName(gather)+" segments",
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
	if err := s.gate.Enter(&s.d.core, "Record"); err != nil {
		return err
	}
	defer s.gate.Leave()
	if rc := C.stage_event_record(s.d.lib.c, s.d.ctx, e.e, s.s); rc != 0 {
		return s.d.lib.check(rc, "cuEventRecord")
	}
	return nil
}

// Synchronize waits for all enqueued work (cuStreamSynchronize). It blocks
// the calling OS thread.
func (s *Stream) Synchronize() error {
	if err := s.gate.Enter(&s.d.core, "Synchronize"); err != nil {
		return err
	}
	defer s.gate.Leave()
	if rc := C.stage_stream_sync(s.d.lib.c, s.d.ctx, s.s); rc != 0 {
		return s.d.lib.check(rc, "cuStreamSynchronize")
	}
	return nil
}

// Close waits for the stream's work, frees its descriptor ring and scratch
// and destroys it.
func (s *Stream) Close() error {
	return s.gate.Close(&s.d.core, "Stream.Close", &s.d.core.Streams, s.destroy)
}

// destroy is Close's part in the driver (the gate held).
func (s *Stream) destroy() error {
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
	return first
}

// Event is a CUDA event without timing (device.Event).
type Event struct {
	d    *Device
	e    C.CUevent
	gate vendorkit.Gate
}

// Query reports whether the work before the event is done (cuEventQuery;
// CUDA_ERROR_NOT_READY means not yet) and that work's error if it failed.
func (e *Event) Query() (bool, error) {
	if err := e.d.core.Check("Event.Query"); err != nil {
		return false, err
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
	if err := e.d.core.Check("Event.Wait"); err != nil {
		return err
	}
	if rc := C.stage_event_wait(e.d.lib.c, e.d.ctx, e.e, C.int64_t(e.d.wait.spin())); rc != 0 {
		return e.d.lib.check(rc, "cuEventSynchronize (wait %s)", e.d.wait)
	}
	return nil
}

// Close destroys the event.
func (e *Event) Close() error {
	return e.gate.Close(&e.d.core, "Event.Close", &e.d.core.Events, func() error {
		if rc := C.stage_event_destroy(e.d.lib.c, e.d.ctx, e.e); rc != 0 {
			return e.d.lib.check(rc, "cuEventDestroy")
		}
		return nil
	})
}

// The same-node paths: ipc copies with CopyDtoD, shm pins the shared ring.
var (
	_ device.DtoD           = (*Stream)(nil)
	_ device.HostRegisterer = (*Device)(nil)
)
