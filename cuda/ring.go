package cuda

import (
	"fmt"

	"github.com/stage-kv/stage/device"
)

// desc is one segment for the copy kernel; it matches StageDesc in
// kernels/gather.cu (three little-endian u64, 24 bytes).
type desc struct {
	src, dst, len uint64
}

// ringSlot is one launch's worth of descriptors in host-mapped pinned memory.
type ringSlot struct {
	id    int    // index into the backend's per-slot resources
	descs []desc // host view; the kernel reads the same pages
	// strided views the same memory as strided descriptors: a launch
	// uses one view or the other.
	strided []sdesc
	dev     uint64 // device address of descs[0]
}

// slotOps are the device operations a descRing needs; the real ones live in
// stream.go, tests use a fake.
type slotOps interface {
	// alloc makes slot id with room for n descriptors and its event.
	alloc(id, n int) (*ringSlot, error)
	// done reports whether the launch last submitted with s has completed.
	done(s *ringSlot) (bool, error)
	// wait blocks until it has.
	wait(s *ringSlot) error
	// free releases s's memory and event.
	free(s *ringSlot) error
}

// descRing hands out descriptor slots to one stream's kernel launches. A
// slot is reused only after the event recorded behind the launch that read
// it has completed. Slots are made on demand up to max before any is
// reused; once all exist, acquire asks whether the NEWEST launch is done
// (launches on one stream complete in order, so then all are, and one
// query frees every slot), else reaps completed launches from the oldest,
// else waits for the oldest. With the GPU keeping up, that is one event
// query per max launches. Not safe for concurrent use (the stream's mutex
// guards it).
type descRing struct {
	ops  slotOps
	per  int // descriptors per slot
	max  int // slots at most
	made int
	free []*ringSlot
	busy []*ringSlot // submitted, oldest first

	queries, waits int // event queries and blocking waits so far
}

func newDescRing(ops slotOps, perSlot, maxSlots int) *descRing {
	return &descRing{ops: ops, per: perSlot, max: maxSlots}
}

// acquire returns a slot whose descriptors nobody reads any more.
func (r *descRing) acquire() (*ringSlot, error) {
	if s := r.pop(); s != nil {
		return s, nil
	}
	if r.made < r.max {
		s, err := r.ops.alloc(r.made, r.per)
		if err != nil {
			return nil, err
		}
		r.made++
		return s, nil
	}
	if len(r.busy) == 0 {
		return nil, fmt.Errorf("cuda: descriptor ring: all %d slots checked out", r.max)
	}
	r.queries++
	ok, err := r.ops.done(r.busy[len(r.busy)-1])
	if err != nil {
		return nil, err
	}
	if ok {
		r.retire(len(r.busy))
		return r.pop(), nil
	}
	n := 0
	for n < len(r.busy)-1 { // the newest is known to be running
		r.queries++
		ok, err := r.ops.done(r.busy[n])
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		n++
	}
	if n == 0 {
		r.waits++
		if err := r.ops.wait(r.busy[0]); err != nil {
			return nil, err
		}
		n = 1
	}
	r.retire(n)
	return r.pop(), nil
}

func (r *descRing) pop() *ringSlot {
	n := len(r.free)
	if n == 0 {
		return nil
	}
	s := r.free[n-1]
	r.free = r.free[:n-1]
	return s
}

// retire moves the n oldest busy slots to free.
func (r *descRing) retire(n int) {
	r.free = append(r.free, r.busy[:n]...)
	clear(r.busy[:n])
	r.busy = r.busy[n:]
}

// submit records that s was handed to a launch whose completion ops.done
// will report.
func (r *descRing) submit(s *ringSlot) { r.busy = append(r.busy, s) }

// putBack returns a slot that was acquired but not launched.
func (r *descRing) putBack(s *ringSlot) { r.free = append(r.free, s) }

// inFlight is the number of submitted slots not yet seen complete.
func (r *descRing) inFlight() int { return len(r.busy) }

// close frees every slot. The caller must have synchronized the stream.
func (r *descRing) close() error {
	var first error
	for _, s := range append(r.free, r.busy...) {
		if err := r.ops.free(s); err != nil && first == nil {
			first = err
		}
	}
	r.free, r.busy, r.made = nil, nil, 0
	return first
}

// fillDescs writes descriptors for segs into descs: up to
// len(descs) descriptors, splits any segment longer than maxLen at maxLen
// boundaries (each piece keeps the segment's alignment), and returns how
// many it wrote and where to resume: segment index and byte offset within
// that segment. pinned is the device address matching the first byte of
// segs[si] at offset so; gather puts it in dst, scatter in src.
func fillDescs(descs []desc, segs []device.Seg, si int, so uint64, pinned uint64, gather bool, maxLen uint64) (n, nextSeg int, nextOff, nextPinned uint64) {
	for si < len(segs) && n < len(descs) {
		s := segs[si]
		if so >= s.Len {
			si, so = si+1, 0
			continue
		}
		l := min(s.Len-so, maxLen)
		a := uint64(s.Addr) + so
		if gather {
			descs[n] = desc{src: a, dst: pinned, len: l}
		} else {
			descs[n] = desc{src: pinned, dst: a, len: l}
		}
		n++
		so += l
		pinned += l
	}
	for si < len(segs) && so >= segs[si].Len {
		si, so = si+1, 0
	}
	return n, si, so, pinned
}
