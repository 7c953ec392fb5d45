package vendorkit

import (
	"errors"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/stage-kv/stage/device"
)

func TestCheckMove(t *testing.T) {
	pinned := func(n int) device.Pinned { return device.NewPinned(make([]byte, n), 0) }
	for _, tc := range []struct {
		name   string
		gather bool
		p      device.Pinned
		segs   []device.Seg
		want   Move   // Op, Total, NonEmpty, Last
		err    string // "" : accepted
	}{
		{name: "one", gather: true, p: pinned(8), segs: []device.Seg{{Addr: 0x10, Len: 8}}, want: Move{Op: "Gather", Total: 8, NonEmpty: 1, Last: 0}},
		{name: "empty ones", p: pinned(12), segs: []device.Seg{{Addr: 0x10, Len: 0}, {Addr: 0x20, Len: 4}, {Addr: 0x30, Len: 8}, {Addr: 0x40}},
			want: Move{Op: "Scatter", Total: 12, NonEmpty: 2, Last: 2}},
		{name: "nothing", gather: true, p: pinned(0), segs: nil, want: Move{Op: "Gather", Last: -1}},
		{name: "short", gather: true, p: pinned(16), segs: []device.Seg{{Addr: 0x10, Len: 8}},
			err: "acl: acl:3: Gather: segments add up to 8 B, pinned buffer is 16 B"},
		{name: "end overflows", p: pinned(16), segs: []device.Seg{{Addr: math.MaxUint64 - 3, Len: 8}},
			err: "acl: acl:3: Scatter: segment 0 (0xfffffffffffffffc, 8 B) overflows"},
		{name: "total overflows", gather: true, p: pinned(16), segs: []device.Seg{{Addr: 0, Len: 8}, {Addr: 0, Len: math.MaxUint64 - 4}},
			err: "acl: acl:3: Gather: segment 1 (0x0, 18446744073709551611 B) overflows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := CheckMove(newCore(t), tc.gather, tc.p, tc.segs)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("CheckMove: %+v, %v; want %q", m, err, tc.err)
				}
				return
			}
			if err != nil || m.Op != tc.want.Op || m.Total != tc.want.Total || m.NonEmpty != tc.want.NonEmpty || m.Last != tc.want.Last ||
				m.Gather != tc.gather || len(m.Segs) != len(tc.segs) || m.Pinned.Len() != tc.p.Len() {
				t.Fatalf("CheckMove: %+v, %v; want %+v", m, err, tc.want)
			}
		})
	}
}

func TestGateMove(t *testing.T) {
	c := newCore(t)
	var g Gate
	var got []Move
	enqueue := func(m Move) error { got = append(got, m); return nil }
	p := device.NewPinned(make([]byte, 8), 0)
	if err := g.Move(c, true, p, []device.Seg{{Addr: 0x10, Len: 4}}, enqueue); err == nil || len(got) != 0 {
		t.Errorf("a move that does not add up: %v, %d enqueued", err, len(got))
	}
	if err := g.Move(c, false, device.NewPinned(nil, 0), nil, enqueue); err != nil || len(got) != 0 {
		t.Errorf("an empty move: %v, %d enqueued (want none)", err, len(got))
	}
	if err := g.Move(c, true, p, []device.Seg{{Addr: 0x10, Len: 4}, {Addr: 0x20, Len: 4}}, enqueue); err != nil || len(got) != 1 || got[0].Total != 8 {
		t.Errorf("a move: %v, enqueued %+v", err, got)
	}
	// The gate is held while enqueue runs and let go after.
	err := g.Move(c, true, p, []device.Seg{{Addr: 0x10, Len: 8}}, func(Move) error {
		if g.mu.TryLock() {
			t.Error("the gate is not held during enqueue")
		}
		return errors.New("refused")
	})
	if err == nil || err.Error() != "refused" || !g.mu.TryLock() {
		t.Errorf("enqueue's error: %v, or the gate was left held", err)
	}
	g.mu.Unlock()
}

func TestGateClose(t *testing.T) {
	c := newCore(t)
	var g Gate
	c.Count(&c.Events, 1)
	released := 0
	release := func() error { released++; return errors.New("destroy failed") }
	if err := g.Close(c, "Event.Close", &c.Events, release); err == nil || err.Error() != "destroy failed" || released != 1 || c.Events != 0 {
		t.Fatalf("Close: %v, released %d, %d events counted", err, released, c.Events)
	}
	if err := g.Close(c, "Event.Close", &c.Events, release); !errors.Is(err, device.ErrClosed) || !strings.Contains(err.Error(), "Event.Close") || released != 1 || c.Events != 0 {
		t.Errorf("Close twice: %v, released %d, %d events counted", err, released, c.Events)
	}
	if err := g.Enter(c, "Record"); !errors.Is(err, device.ErrClosed) {
		t.Errorf("Enter after Close: %v", err)
	}
	if err := g.EnterShared(c, "Event.Query"); !errors.Is(err, device.ErrClosed) {
		t.Errorf("EnterShared after Close: %v", err)
	}
	if !g.IsClosed() {
		t.Error("IsClosed after Close: false")
	}
	// A gate of an open object on a closed device refuses too, and is
	// left unlocked.
	var h Gate
	c.Shut(func() string { return "" })
	if err := h.Enter(c, "Synchronize"); !errors.Is(err, device.ErrClosed) || !h.mu.TryLock() {
		t.Errorf("Enter on a closed device: %v, or the gate was left held", err)
	}
}

func TestGateShared(t *testing.T) {
	c := newCore(t)
	var g Gate
	if err := g.EnterShared(c, "Event.Query"); err != nil {
		t.Fatal(err)
	}
	if err := g.EnterShared(c, "Event.Wait"); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error)
	var wg sync.WaitGroup
	wg.Go(func() { closed <- g.Close(c, "Event.Close", &c.Events, func() error { return nil }) })
	g.LeaveShared()
	select {
	case err := <-closed:
		t.Fatalf("Close ran while a shared call held the gate: %v", err)
	default:
	}
	g.LeaveShared()
	if err := <-closed; err != nil {
		t.Errorf("Close after the shared calls: %v", err)
	}
	wg.Wait()
}

func TestGateEnterAllocatesNothing(t *testing.T) {
	c := newCore(t)
	var g Gate
	if n := testing.AllocsPerRun(100, func() {
		if g.Enter(c, "Record") == nil {
			g.Leave()
		}
		if g.EnterShared(c, "Event.Query") == nil {
			g.LeaveShared()
		}
	}); n != 0 {
		t.Errorf("Enter and EnterShared allocate %v times a call, want 0 (they are on every Gather)", n)
	}
}

type fakeStream struct {
	c    *Core
	gate Gate
	n    int
}

func (s *fakeStream) enqueue(m Move) error { s.n += int(m.Total); return nil }

func (s *fakeStream) Gather(p device.Pinned, segs []device.Seg) error {
	return s.gate.Move(s.c, true, p, segs, s.enqueue)
}

func TestGateMoveAllocatesNothing(t *testing.T) {
	s := &fakeStream{c: newCore(t)}
	p := device.NewPinned(make([]byte, 8), 0)
	segs := []device.Seg{{Addr: 0x10, Len: 4}, {Addr: 0x20, Len: 4}}
	if n := testing.AllocsPerRun(100, func() {
		if err := s.Gather(p, segs); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("a Gather through Gate.Move allocates %v times, want 0", n)
	}
}
