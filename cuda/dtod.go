package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/stage-kv/stage/device"
)

// engineMin: device-to-device copies at least this long go to the copy
// engine one each (cuMemcpyDtoDAsync runs them at the link's rate for a
// few microseconds of driver time); shorter ones are batched, since one
// engine copy per 16 KiB block moves scattered blocks at a few GB/s.
const engineMin = 1 << 20

// CopyDtoD enqueues a device-to-device copy of n bytes (cuMemcpyDtoDAsync;
// with unified addressing src and dst may sit on different devices, or in
// memory imported from another process).
func (s *Stream) CopyDtoD(dst, src device.Addr, n uint64) error {
	if err := s.gate.Enter(&s.d.core, "CopyDtoD"); err != nil {
		return err
	}
	defer s.gate.Leave()
	if n == 0 {
		return nil
	}
	return s.dtod1(dst, src, n)
}

func (s *Stream) dtod1(dst, src device.Addr, n uint64) error {
	l := s.d.lib
	if rc := C.stage_dtod_async(l.c, s.d.ctx, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), s.s); rc != 0 {
		return l.check(rc, "cuMemcpyDtoDAsync(%d B %#x -> %#x)", n, uint64(src), uint64(dst))
	}
	return nil
}

// CopyDtoDBatch enqueues cs in order (device.DtoDBatch): copies of
// engineMin or more one each on the copy engine, runs of shorter ones as
// the device's copy mode does scattered segments: the copy kernel (its
// thread blocks read and write both sides directly, through NVLink for
// peer memory), one cuMemcpyBatchAsync, or one cgo call of per-copy
// copies.
func (s *Stream) CopyDtoDBatch(cs []device.Copy) error {
	for i, c := range cs {
		if uint64(c.Src)+c.Len < uint64(c.Src) || uint64(c.Dst)+c.Len < uint64(c.Dst) {
			return fmt.Errorf("cuda: %s: CopyDtoDBatch: copy %d (%d B %#x -> %#x) overflows", s.d, i, c.Len, uint64(c.Src), uint64(c.Dst))
		}
	}
	if err := s.gate.Enter(&s.d.core, "CopyDtoDBatch"); err != nil {
		return err
	}
	defer s.gate.Leave()
	for i := 0; i < len(cs); {
		if c := cs[i]; c.Len >= engineMin {
			if err := s.dtod1(c.Dst, c.Src, c.Len); err != nil {
				return fmt.Errorf("copy %d of %d: %w", i, len(cs), err)
			}
			i++
			continue
		}
		j := i
		for j < len(cs) && cs[j].Len < engineMin {
			j++
		}
		if err := s.smallDtoD(cs[i:j]); err != nil {
			return fmt.Errorf("copies %d..%d of %d: %w", i, j-1, len(cs), err)
		}
		i = j
	}
	return nil
}

// smallDtoD enqueues a run of short copies (gate held).
func (s *Stream) smallDtoD(cs []device.Copy) error {
	nz := 0
	var total uint64
	for _, c := range cs {
		if c.Len > 0 {
			nz++
			total += c.Len
		}
	}
	switch {
	case nz == 0:
		return nil
	case nz == 1:
		for _, c := range cs {
			if c.Len > 0 {
				return s.dtod1(c.Dst, c.Src, c.Len)
			}
		}
	case s.d.mode == CopyKernel:
		return s.kernelDtoD(cs)
	}
	return s.listDtoD(cs, nz, total)
}

// kernelDtoD launches the copy kernel over cs, one launch per ring slot.
func (s *Stream) kernelDtoD(cs []device.Copy) error {
	ci, co := 0, uint64(0)
	return s.kernelRun("device-to-device copies",
		func() bool { return ci < len(cs) },
		func(sl *ringSlot) (n int, strided bool) {
			n, ci, co = fillCopyDescs(sl.descs, cs, ci, co, maxDescBytes)
			return n, false
		})
}

// fillCopyDescs writes descriptors for cs from copy ci, byte co on, each
// at most maxLen long, until descs is full; it returns how many it wrote
// and where the next call goes on.
func fillCopyDescs(descs []desc, cs []device.Copy, ci int, co uint64, maxLen uint64) (n, nextCopy int, nextOff uint64) {
	for ci < len(cs) && n < len(descs) {
		c := cs[ci]
		if co >= c.Len {
			ci, co = ci+1, 0
			continue
		}
		l := min(c.Len-co, maxLen)
		descs[n] = desc{src: uint64(c.Src) + co, dst: uint64(c.Dst) + co, len: l}
		n++
		co += l
	}
	for ci < len(cs) && co >= cs[ci].Len {
		ci, co = ci+1, 0
	}
	return n, ci, co
}

// listDtoD fills the stream's C scratch arrays with cs and issues one
// batched copy, or one copy each from a single cgo call.
func (s *Stream) listDtoD(cs []device.Copy, nz int, total uint64) error {
	l := s.d.lib
	if s.sc == nil {
		s.sc = C.stage_scratch_new()
		if s.sc == nil {
			return fmt.Errorf("cuda: %s: CopyDtoDBatch: out of host memory for copy descriptors", s.d)
		}
	}
	if C.stage_scratch_reserve(s.sc, C.size_t(nz)) != 0 {
		return fmt.Errorf("cuda: %s: CopyDtoDBatch: out of host memory for %d copy descriptors", s.d, nz)
	}
	dsts := unsafe.Slice(s.sc.dsts, nz)
	srcs := unsafe.Slice(s.sc.srcs, nz)
	sizes := unsafe.Slice(s.sc.sizes, nz)
	i := 0
	for _, c := range cs {
		if c.Len == 0 {
			continue
		}
		dsts[i], srcs[i], sizes[i] = C.CUdeviceptr(c.Dst), C.CUdeviceptr(c.Src), C.size_t(c.Len)
		i++
	}
	if s.d.mode == CopyBatch {
		if rc := C.stage_batch(l.c, s.d.ctx, s.sc, C.size_t(nz), s.s); rc != 0 {
			return l.check(rc, "cuMemcpyBatchAsync(%d device-to-device copies, %d B)%s", nz, total, s.failAt(nz))
		}
		return nil
	}
	if rc := C.stage_percopy(l.c, s.d.ctx, 2, s.sc, C.size_t(nz), s.s); rc != 0 {
		k := int(s.sc.fail)
		return l.check(rc, "cuMemcpyDtoDAsync(%d B %#x -> %#x) [copy %d of %d]", uint64(sizes[k]), uint64(srcs[k]), uint64(dsts[k]), k+1, nz)
	}
	return nil
}

var _ device.DtoDBatch = (*Stream)(nil)
