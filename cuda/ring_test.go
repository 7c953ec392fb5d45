package cuda

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stage-kv/stage/device"
)

// fakeSlots is a slotOps modelling one stream: launches complete in
// submission order, and progress (how many have completed) moves only when
// the test or a wait says so.
type fakeSlots struct {
	seq      map[int]int // slot id -> submission number of its last launch
	next     int
	progress int // launches 0..progress-1 have completed
	queries  int
	waited   []int
	freed    []int
	allocs   int
	failErr  error
}

func newFakeSlots() *fakeSlots { return &fakeSlots{seq: map[int]int{}} }

func (f *fakeSlots) alloc(id, n int) (*ringSlot, error) {
	f.allocs++
	return &ringSlot{id: id, descs: make([]desc, n), dev: uint64(0x1000 * (id + 1))}, nil
}

// submit is what the stream does after a launch.
func (f *fakeSlots) submit(r *descRing, s *ringSlot) {
	f.seq[s.id] = f.next
	f.next++
	r.submit(s)
}

func (f *fakeSlots) running(id int) bool {
	n, ok := f.seq[id]
	return ok && n >= f.progress
}

func (f *fakeSlots) done(s *ringSlot) (bool, error) {
	f.queries++
	if f.failErr != nil {
		return true, f.failErr
	}
	return !f.running(s.id), nil
}

func (f *fakeSlots) wait(s *ringSlot) error {
	f.waited = append(f.waited, s.id)
	f.progress = max(f.progress, f.seq[s.id]+1)
	return nil
}

func (f *fakeSlots) free(s *ringSlot) error {
	f.freed = append(f.freed, s.id)
	return nil
}

func TestDescRingGrowsThenWaitsForOldest(t *testing.T) {
	f := newFakeSlots()
	r := newDescRing(f, 4, 3)
	var order []int
	for range 3 {
		s, err := r.acquire()
		if err != nil {
			t.Fatal(err)
		}
		if len(s.descs) != 4 {
			t.Fatalf("slot has %d descriptors, want 4", len(s.descs))
		}
		order = append(order, s.id)
		f.submit(r, s)
	}
	if f.allocs != 3 || f.queries != 0 || !slices.Equal(order, []int{0, 1, 2}) {
		t.Fatalf("allocs %d queries %d order %v, want 3 new slots 0,1,2 and no query", f.allocs, f.queries, order)
	}
	// All three in flight, none done: the fourth acquire waits for slot 0.
	s, err := r.acquire()
	if err != nil {
		t.Fatal(err)
	}
	if s.id != 0 || !slices.Equal(f.waited, []int{0}) || f.allocs != 3 {
		t.Fatalf("got slot %d after waiting on %v (allocs %d), want slot 0 after waiting on [0]", s.id, f.waited, f.allocs)
	}
	f.submit(r, s)
	if r.inFlight() != 3 {
		t.Fatalf("in flight %d, want 3", r.inFlight())
	}
}

func TestDescRingOneQueryFreesAll(t *testing.T) {
	f := newFakeSlots()
	r := newDescRing(f, 2, 4)
	for range 4 {
		s, _ := r.acquire()
		f.submit(r, s)
	}
	f.progress = f.next // the GPU caught up
	for i := range 4 {
		s, err := r.acquire()
		if err != nil {
			t.Fatal(err)
		}
		if f.running(s.id) {
			t.Fatalf("acquire %d: got running slot %d", i, s.id)
		}
		f.submit(r, s)
	}
	if f.queries != 1 || f.allocs != 4 || len(f.waited) != 0 {
		t.Fatalf("queries %d allocs %d waits %v, want 1 query, 4 slots, no wait", f.queries, f.allocs, f.waited)
	}
}

func TestDescRingReapsOldestWhileNewestRuns(t *testing.T) {
	f := newFakeSlots()
	r := newDescRing(f, 2, 3)
	for range 3 {
		s, _ := r.acquire()
		f.submit(r, s)
	}
	f.progress = 2 // slots 0 and 1 done, 2 running
	s, err := r.acquire()
	if err != nil {
		t.Fatal(err)
	}
	if f.running(s.id) || len(f.waited) != 0 || r.inFlight() != 1 {
		t.Fatalf("got slot %d (running %v), waits %v, in flight %d; want a finished slot, no wait, 1 in flight", s.id, f.running(s.id), f.waited, r.inFlight())
	}
	r.putBack(s)
	if s2, _ := r.acquire(); s2 != s {
		t.Fatal("putBack slot not reused first")
	}
}

func TestDescRingNeverReusesBusySlot(t *testing.T) {
	f := newFakeSlots()
	r := newDescRing(f, 1, 4)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 1000 {
		s, err := r.acquire()
		if err != nil {
			t.Fatal(err)
		}
		if f.running(s.id) {
			t.Fatalf("iteration %d: slot %d handed out while its launch runs", i, s.id)
		}
		f.submit(r, s)
		f.progress += rng.IntN(3) // the GPU moves at its own pace
		f.progress = min(f.progress, f.next)
	}
	if f.allocs != 4 {
		t.Fatalf("%d slots made, want exactly max 4", f.allocs)
	}
	t.Logf("1000 launches: %d event queries, %d waits", f.queries, len(f.waited))
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(f.freed)
	if !slices.Equal(f.freed, []int{0, 1, 2, 3}) {
		t.Fatalf("close freed %v, want all 4 slots", f.freed)
	}
}

func TestDescRingQueryError(t *testing.T) {
	f := newFakeSlots()
	r := newDescRing(f, 1, 1)
	s, _ := r.acquire()
	f.submit(r, s)
	f.failErr = errors.New("sticky launch failure")
	if _, err := r.acquire(); !errors.Is(err, f.failErr) {
		t.Fatalf("got %v, want the event's error", err)
	}
}

func TestFillDescs(t *testing.T) {
	segs := []device.Seg{
		{Addr: 0x10000, Len: 10},
		{Addr: 0x20000, Len: 0},
		{Addr: 0x30001, Len: 25}, // split at 8
		{Addr: 0x40000, Len: 3},
	}
	const pinned = 0x900000
	descs := make([]desc, 3)
	var all []desc
	si, so, p := 0, uint64(0), uint64(pinned)
	for round := 0; si < len(segs); round++ {
		if round > 10 {
			t.Fatal("fillDescs does not progress")
		}
		var n int
		n, si, so, p = fillDescs(descs, segs, si, so, p, true, 8)
		all = append(all, descs[:n]...)
	}
	want := []desc{
		{0x10000, pinned, 8}, {0x10008, pinned + 8, 2},
		{0x30001, pinned + 10, 8}, {0x30009, pinned + 18, 8}, {0x30011, pinned + 26, 8}, {0x30019, pinned + 34, 1},
		{0x40000, pinned + 35, 3},
	}
	if !slices.Equal(all, want) {
		t.Fatalf("gather descriptors:\n got %x\nwant %x", all, want)
	}
	if p != pinned+38 {
		t.Fatalf("pinned cursor %#x, want %#x", p, pinned+38)
	}
	// Scatter swaps src and dst.
	n, si, _, _ := fillDescs(make([]desc, 8), segs[:1], 0, 0, pinned, false, 1<<20)
	if n != 1 || si != 1 {
		t.Fatalf("scatter: n %d si %d", n, si)
	}
	d := make([]desc, 1)
	fillDescs(d, segs[:1], 0, 0, pinned, false, 1<<20)
	if d[0] != (desc{src: pinned, dst: 0x10000, len: 10}) {
		t.Fatalf("scatter descriptor %x", d[0])
	}
	// Trailing zero-length segments are consumed, so callers stop.
	n, si, _, _ = fillDescs(descs, []device.Seg{{Addr: 1, Len: 1}, {Addr: 2, Len: 0}}, 0, 0, pinned, true, 8)
	if n != 1 || si != 2 {
		t.Fatalf("trailing empty segment: n %d si %d, want 1 2", n, si)
	}
}
