package staging

import (
	"slices"
	"testing"
)

func TestPickStream(t *testing.T) {
	live := func(inflight int, unsent, sock uint64) sstream {
		return sstream{alive: true, inflight: inflight, unsent: unsent, sock: sock}
	}
	dead := sstream{inflight: 0}
	for _, tc := range []struct {
		name      string
		streams   []sstream
		byBytes   bool
		queue     int
		want      int
		wantAlive bool
	}{
		{"none", nil, true, 0, -1, false},
		{"all dead", []sstream{dead, dead}, true, 0, -1, false},
		{"by chunks: fewest unwritten", []sstream{live(2, 0, 0), live(1, 0, 9<<20)}, false, 0, 1, true},
		{"by bytes: the socket counts", []sstream{live(1, 4<<20, 0), live(0, 0, 9<<20)}, true, 0, 0, true},
		{"by bytes: socket plus unwritten", []sstream{live(1, 4<<20, 1<<20), live(1, 4<<20, 0), live(0, 0, 6<<20)}, true, 0, 1, true},
		{"by bytes: tie goes to fewer chunks", []sstream{live(2, 2<<20, 0), live(1, 1<<20, 1<<20)}, true, 0, 1, true},
		{"by bytes: full tie goes to the lower index", []sstream{live(1, 5, 5), live(1, 5, 5)}, true, 0, 0, true},
		{"dead streams are skipped however empty", []sstream{dead, live(3, 9, 9)}, true, 0, 1, true},
		{"queue: the lightest with room", []sstream{live(2, 0, 0), live(1, 8<<20, 8<<20)}, true, 2, 1, true},
		{"queue: none with room", []sstream{live(2, 0, 0), live(2, 0, 0)}, true, 2, -1, true},
		{"queue by chunks", []sstream{live(1, 0, 0), live(0, 0, 0)}, false, 1, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, alive := pickStream(tc.streams, tc.byBytes, tc.queue)
			if got != tc.want || alive != tc.wantAlive {
				t.Fatalf("pickStream = %d, %v; want %d, %v", got, alive, tc.want, tc.wantAlive)
			}
		})
	}
}

// The core with a socket probe: a stream whose socket still holds bytes
// gets no chunk while another's is emptier, though it has no chunk
// unwritten; the probe runs once per Step that places chunks.
func TestSenderBalancesOnSockets(t *testing.T) {
	h := newHarness(t, 13)
	h.s = NewSenderDepth(13, 0)
	sock := []uint64{64, 0, 24}
	probes := 0
	h.s.SetSocketProbe(func(session uint64, q []uint64) {
		if session != 1 || len(q) != 3 {
			t.Errorf("probe(%d, %d entries), want session 1 with 3", session, len(q))
		}
		probes++
		copy(q, sock)
	})
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 3, Credits: 12})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 6)}) // 6 chunks of 8 B
	if probes != 0 {
		t.Fatalf("%d probes before any chunk was gathered", probes)
	}
	h.finishCopies(nil) // one Step per chunk
	got := make([]int, len(h.sends))
	for i, s := range h.sends {
		got[i] = s.Stream
	}
	// Bytes held (socket + unwritten) before each choice, and the choice:
	// [64 0 24] 1; [64 8 24] 1; [64 16 24] 1; [64 24 24] 2 (a tie: 3
	// unwritten chunks against 0); [64 24 32] 1; [64 32 32] 2 (4 against 1).
	// Stream 0, with nothing unwritten but the fullest socket, gets none;
	// by unwritten chunks it would have had two.
	want := []int{1, 1, 1, 2, 1, 2}
	if !slices.Equal(got, want) {
		t.Fatalf("chunks went to streams %v, want %v", got, want)
	}
	if probes != len(want) {
		t.Fatalf("%d probes for %d chunks placed one per Step", probes, len(want))
	}
	h.run()
	if err, ok := h.done[1]; !ok || err != nil {
		t.Fatalf("transfer done %v, err %v", ok, err)
	}
	for i, st := range h.s.sessions[1].streams {
		if st.inflight != 0 || st.unsent != 0 {
			t.Fatalf("stream %d: %d chunks, %d B unwritten after everything was written", i, st.inflight, st.unsent)
		}
	}
	h.idle()
}

// With a tail chunk set, the core cuts a transfer's end finer when it is
// submitted, for the session's live streams, and the transfer completes.
func TestSenderSplitsTail(t *testing.T) {
	h := newHarness(t, 13)
	h.s = NewSenderDepth(13, 0)
	h.s.SetTailChunk(2)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 2, Credits: 12})
	p, err := NewPlan([]PlanOp{{Src: 4096, Len: 48}}, 8) // 6 chunks, none cut yet
	if err != nil {
		t.Fatal(err)
	}
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: p})
	want := tailSizes(48, 8, 2, 2)
	if want == nil || p.Len() != 6-2+len(want) {
		t.Fatalf("plan of %d chunks after submit, want the last two of 6 cut into %v", p.Len(), want)
	}
	h.run()
	if err, ok := h.done[1]; !ok || err != nil {
		t.Fatalf("transfer done %v, err %v", ok, err)
	}
	h.idle()
}
