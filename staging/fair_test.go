package staging

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestFairShare(t *testing.T) {
	for _, tc := range []struct {
		usable, n, share, reserve int
	}{
		{32, 1, 30, 2},
		{32, 2, 16, 2},
		{32, 3, 10, 2},
		{32, 40, 1, 2},
		{16, 1, 15, 1},
		{8, 1, 8, 0},
		{8, 3, 2, 0},
		{1, 1, 1, 0},
		{64, 0, 60, 4},
	} {
		if got := Reserve(tc.usable); got != tc.reserve {
			t.Errorf("Reserve(%d) = %d, want %d", tc.usable, got, tc.reserve)
		}
		if got := FairShare(tc.usable, tc.n); got != tc.share {
			t.Errorf("FairShare(%d, %d) = %d, want %d", tc.usable, tc.n, got, tc.share)
		}
	}
	for _, tc := range []struct {
		held, free, share, reserve int
		want                       bool
	}{
		{0, 1, 16, 2, true},   // under its share: the last free slot too
		{15, 1, 16, 2, true},  // still under
		{16, 3, 16, 2, true},  // at its share: borrows, 2 stay free
		{16, 2, 16, 2, false}, // the reserve holds
		{20, 0, 16, 2, false}, // nothing free
		{8, 1, 8, 0, true},    // no reserve in a small pool
	} {
		if got := MayTake(tc.held, tc.free, tc.share, tc.reserve); got != tc.want {
			t.Errorf("MayTake(held %d, free %d, share %d, reserve %d) = %v, want %v", tc.held, tc.free, tc.share, tc.reserve, got, tc.want)
		}
	}
}

// A peer that stops reading keeps every slot it took. Alone it takes the
// pool less the reserve; a second peer starts at once on the reserve, and
// every slot the first gives back goes to the second until it has its
// share.
func TestSenderFairShareStalledPeer(t *testing.T) {
	h := newHarness(t, 32)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 8, Credits: 1000})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 1000)})
	if got, want := len(h.copies), 30; got != want {
		t.Fatalf("a lone session started %d copies, want %d (the pool less the reserve)", got, want)
	}
	h.finishCopies(nil)
	stuck := h.sends // session 1's peer never reads: these are never written
	h.sends = nil
	h.step(Event{Kind: EvSessionUp, Session: 2, N: 2, Credits: 64})
	h.step(Event{Kind: EvSubmit, Session: 2, Transfer: 2, Plan: plan(t, 40)})
	if len(h.copies) != 2 || h.copies[0].Transfer != 2 || h.copies[1].Transfer != 2 {
		t.Fatalf("the newcomer got copies %+v, want two on the reserve", h.copies)
	}
	// Session 1 gives back slots one at a time: each goes to session 2
	// (under its share of 16), never back to session 1.
	for i := 0; i < 14; i++ {
		w := stuck[0]
		stuck = stuck[1:]
		h.step(Event{Kind: EvWritten, Transfer: w.Transfer, Chunk: w.Chunk, Slot: w.Slot, Stream: w.Stream})
		last := h.copies[len(h.copies)-1]
		if last.Transfer != 2 {
			t.Fatalf("slot %d given back by the stalled session went to transfer %d, want the newcomer's", i, last.Transfer)
		}
	}
	if s1, s2 := h.s.sessions[1].held, h.s.sessions[2].held; s1 != 16 || s2 != 16 {
		t.Fatalf("held %d and %d, want 16 each", s1, s2)
	}
	// The stalled session is cut off; the other finishes and has the pool.
	h.step(Event{Kind: EvSessionDown, Session: 1, Err: errors.New("stalled")})
	for _, w := range stuck {
		h.step(Event{Kind: EvWritten, Transfer: w.Transfer, Chunk: w.Chunk, Slot: w.Slot, Stream: w.Stream, Err: errors.New("shut down")})
	}
	h.run()
	if err, ok := h.done[2]; !ok || err != nil {
		t.Fatalf("the newcomer's transfer: done %v, err %v", ok, err)
	}
	h.idle()
}

// fairOK checks the fair-share rules on the core's state after a Step in
// which the sessions in took got copies.
func fairOK(t *testing.T, s *Sender, took map[uint64]bool) {
	t.Helper()
	var want []*ssess
	for _, ss := range s.order {
		if s.wants(ss) {
			want = append(want, ss)
		}
	}
	if len(want) == 0 {
		return
	}
	usable := s.slots - s.broken
	share, reserve := FairShare(usable, len(want)), Reserve(usable)
	free := len(s.free)
	for _, ss := range want {
		if ss.held < share && free > 0 {
			t.Fatalf("session %d holds %d (share %d) and waits with %d slots free", ss.id, ss.held, share, free)
		}
	}
	if free > reserve {
		t.Fatalf("%d sessions want slots and %d are free (reserve %d)", len(want), free, reserve)
	}
	for _, ss := range s.order {
		if !took[ss.id] || ss.held <= share {
			continue
		}
		if free < reserve {
			t.Fatalf("session %d borrowed up to %d (share %d), leaving %d free (reserve %d)", ss.id, ss.held, share, free, reserve)
		}
		for _, o := range want {
			if o.held < share {
				t.Fatalf("session %d borrowed up to %d (share %d) while session %d waited under its share (%d)", ss.id, ss.held, share, o.id, o.held)
			}
		}
	}
}

// TestSenderFairRandom drives several sessions at random (submits,
// copies, writes, acks, stalls, lost streams, sessions coming and going)
// and checks the fair-share rules after every step; every transfer ends
// and every slot comes home.
func TestSenderFairRandom(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		r := rand.New(rand.NewPCG(seed, 16))
		h := newHarness(t, 16+r.IntN(33))
		var took map[uint64]bool
		h.onReady = func(rd *Ready) {
			took = map[uint64]bool{}
			for _, c := range rd.Copies {
				took[h.s.xfers[c.Transfer].sess.id] = true
			}
		}
		next := uint64(1)
		up := map[uint64]bool{}
		for i := 0; i < 400; i++ {
			sess := 1 + r.Uint64N(4)
			switch k := r.IntN(12); {
			case k == 0:
				if !up[sess] {
					up[sess] = true
					h.step(Event{Kind: EvSessionUp, Session: sess, N: 1 + r.IntN(4), Credits: 1 + r.IntN(64)})
				}
			case k <= 2 && up[sess]:
				h.step(Event{Kind: EvSubmit, Session: sess, Transfer: Key(next), Plan: plan(t, 1+r.IntN(40))})
				next++
			case k <= 4 && len(h.copies) > 0:
				i := r.IntN(len(h.copies))
				c := h.copies[i]
				h.copies = slices.Delete(h.copies, i, i+1)
				h.step(Event{Kind: EvCopyDone, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot})
			case k <= 6 && len(h.sends) > 0 && r.IntN(3) > 0: // some peers are slow to read
				i := r.IntN(len(h.sends))
				c := h.sends[i]
				h.sends = slices.Delete(h.sends, i, i+1)
				h.written = append(h.written, c)
				h.step(Event{Kind: EvWritten, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream})
			case k <= 9 && len(h.written) > 0:
				i := r.IntN(len(h.written))
				c := h.written[i]
				h.written = slices.Delete(h.written, i, i+1)
				h.step(Event{Kind: EvAck, Session: c.Session, Transfer: c.Transfer, Chunks: []uint32{c.Chunk}})
			case k == 10 && up[sess] && r.IntN(8) == 0:
				up[sess] = false
				h.step(Event{Kind: EvSessionDown, Session: sess, Err: errors.New("gone")})
			default:
				continue
			}
			fairOK(t, h.s, took)
		}
		// Let everything out: failed writes for sessions that went down.
		for i := 0; i < 1000 && len(h.copies)+len(h.sends)+len(h.written) > 0; i++ {
			h.finishCopies(nil)
			ss := h.sends
			h.sends = nil
			for _, c := range ss {
				var err error
				if !up[c.Session] {
					err = errors.New("gone")
				} else {
					h.written = append(h.written, c)
				}
				h.step(Event{Kind: EvWritten, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream, Err: err})
			}
			h.ackAll()
		}
		for id := Key(1); id < Key(next); id++ {
			if _, ok := h.done[id]; !ok {
				t.Fatalf("seed %d: transfer %d never ended", seed, id)
			}
		}
		h.idle()
		if t.Failed() {
			t.Fatalf("seed %d", seed)
		}
	}
}
