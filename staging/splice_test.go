package staging

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// wcopy is a chunk copy the kernel took by reference: it points at the
// pages its slot had (gen) when it was written.
type wcopy struct {
	SendCmd
	gen int
}

// spliceHarness drives the core in splice mode and models the kernel: a
// slot's pages are replaced only by renewal (gen counts them), and every
// copy written and not yet read by the receiver still references the pages
// it was written from. A copy given up unanswered (its stream was lost)
// may sit in a socket buffer forever. Each Ready is checked: no copy may
// be gathered into pages such a copy still references.
type spliceHarness struct {
	*harness
	gen   map[SendSlot]int
	wire  []wcopy // on a live stream, unanswered
	limbo []wcopy // given up unanswered: the kernel may still hold them
	taint []SendSlot
	// written by the kernel (on the wire, answerable) but not yet reported
	// to the core: the receiver's answer can overtake the writer's report
	unreported []SendCmd
}

func newSpliceHarness(t *testing.T, slots int) *spliceHarness {
	h := &spliceHarness{harness: newHarness(t, slots), gen: map[SendSlot]int{}}
	h.onReady = func(r *Ready) {
		for _, c := range r.Copies {
			for _, w := range append(slices.Clip(h.wire), h.limbo...) {
				if w.Slot == c.Slot && w.gen == h.gen[c.Slot] {
					h.t.Fatalf("chunk %d gathered into slot %d while chunk %d written from its pages is still unread", c.Chunk, c.Slot, w.Chunk)
				}
			}
		}
		h.taint = append(h.taint, r.Taint...)
	}
	return h
}

// writeAll reports every pending send spliced onto its stream.
func (h *spliceHarness) writeAll() {
	ss := h.sends
	h.sends = nil
	for _, c := range ss {
		h.wire = append(h.wire, wcopy{SendCmd: c, gen: h.gen[c.Slot]})
		h.step(Event{Kind: EvWritten, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream, Spliced: true})
	}
}

// reportAll tells the core of every write it has not heard of yet.
func (h *spliceHarness) reportAll() {
	us := h.unreported
	h.unreported = nil
	for _, c := range us {
		h.step(Event{Kind: EvWritten, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream, Spliced: true})
	}
}

// answer has the receiver answer the copies on the wire that pick selects,
// with an Ack, or a Resend when resend says so.
func (h *spliceHarness) answer(pick func(w wcopy) bool, resend bool) {
	var keep []wcopy
	var ans []wcopy
	for _, w := range h.wire {
		if pick(w) {
			ans = append(ans, w)
		} else {
			keep = append(keep, w)
		}
	}
	h.wire = keep
	for _, w := range ans {
		if resend {
			h.step(Event{Kind: EvResend, Session: w.Session, Transfer: w.Transfer, Chunk: w.Chunk})
		} else {
			h.step(Event{Kind: EvAck, Session: w.Session, Transfer: w.Transfer, Chunks: []uint32{w.Chunk}})
		}
	}
}

func all(wcopy) bool { return true }

// loseStream moves the stream's copies to limbo and tells the core.
func (h *spliceHarness) loseStream(session uint64, stream int) {
	var keep []wcopy
	for _, w := range h.wire {
		if w.Session == session && w.Stream == stream {
			h.limbo = append(h.limbo, w)
		} else {
			keep = append(keep, w)
		}
	}
	h.wire = keep
	h.step(Event{Kind: EvStreamLost, Session: session, Stream: stream, Err: errors.New("reset")})
}

// renewAll gives every tainted slot fresh pages and reports it.
func (h *spliceHarness) renewAll() {
	ts := h.taint
	h.taint = nil
	for _, s := range ts {
		h.gen[s]++
		h.step(Event{Kind: EvRenewed, Slot: s})
	}
}

// pump moves everything until nothing is left: copies, writes, answers
// of what is on the wire, renewals.
func (h *spliceHarness) pump() {
	for i := 0; i < 10000 && len(h.copies)+len(h.sends)+len(h.unreported)+len(h.wire)+len(h.taint) > 0; i++ {
		h.finishCopies(nil)
		h.reportAll()
		h.writeAll()
		h.answer(all, false)
		h.renewAll()
	}
}

// settled: every slot home, none out for renewal, no transfer left, and
// the session's credits back to what it was granted.
func (h *spliceHarness) settled(credits int) {
	h.t.Helper()
	h.idle()
	if n := h.s.Renewing(); n != 0 {
		h.t.Errorf("%d slots still out for renewal", n)
	}
	if got := h.s.Credits(1); credits >= 0 && got != credits {
		h.t.Errorf("credits %d at the end, want %d", got, credits)
	}
}

// A spliced chunk's slot stays held after the write; only the answer frees
// it (no renewal needed), and the freed slot carries the next chunk.
func TestSpliceHeldUntilAnswered(t *testing.T) {
	for _, tc := range []struct {
		name   string
		resend bool
	}{{"ack", false}, {"resend", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newSpliceHarness(t, 2)
			h.step(Event{Kind: EvSessionUp, Session: 1, N: 1, Credits: 8})
			h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 4)})
			h.finishCopies(nil)
			h.writeAll()
			if f := h.s.FreeSlots(); f != 0 || len(h.copies) != 0 {
				t.Fatalf("after the writes: %d free slots, %d copies; want 0 and 0 (held until answered)", f, len(h.copies))
			}
			first := h.wire[0].Chunk
			h.answer(func(w wcopy) bool { return w.Chunk == first }, tc.resend)
			if len(h.taint) != 0 || len(h.copies) != 1 {
				t.Fatalf("after the answer: taint %v, %d copies; want none and 1 (the slot freed)", h.taint, len(h.copies))
			}
			h.pump()
			if err, ok := h.done[1]; !ok || err != nil {
				t.Fatalf("done %v err %v, want success", ok, err)
			}
			h.settled(8)
		})
	}
}

// Every way a held or spliced slot is given up unanswered taints it; the
// core reuses it only after renewal (the harness fails any reuse of pages
// an unread copy still references), and everything comes home.
func TestSpliceTaints(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		act     func(h *spliceHarness)
		wantErr error // nil: the transfer still succeeds
	}{
		{"stream lost", func(h *spliceHarness) { h.loseStream(1, 1) }, nil},
		{"all streams lost", func(h *spliceHarness) { h.loseStream(1, 0); h.loseStream(1, 1) }, ErrNoStreams},
		{"cancel", func(h *spliceHarness) { h.step(Event{Kind: EvCancel, Transfer: 1}) }, ErrCancelled},
		{"nack", func(h *spliceHarness) { h.step(Event{Kind: EvNack, Session: 1, Transfer: 1, Err: boom}) }, boom},
		{"session down", func(h *spliceHarness) {
			h.limbo, h.wire = append(h.limbo, h.wire...), nil
			h.step(Event{Kind: EvSessionDown, Session: 1, Err: boom})
		}, boom},
		{"timeout", func(h *spliceHarness) {
			h.now = h.now.Add(2 * time.Second)
			h.step(Event{Kind: EvTick})
		}, ErrTimeout},
		{"write fails part way", func(h *spliceHarness) {
			first := h.wire[0]
			h.answer(func(w wcopy) bool { return w == first }, false)
			h.finishCopies(nil)
			c := h.sends[0]
			h.sends = nil
			h.limbo = append(h.limbo, wcopy{SendCmd: c, gen: h.gen[c.Slot]})
			h.step(Event{Kind: EvWritten, Transfer: 1, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream, Spliced: true, Err: boom})
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newSpliceHarness(t, 4)
			h.step(Event{Kind: EvSessionUp, Session: 1, N: 2, Credits: 6})
			h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 10), Timeout: time.Second})
			h.finishCopies(nil)
			h.writeAll() // 4 chunks held, on both streams
			if f := h.s.FreeSlots(); f != 0 {
				t.Fatalf("%d free slots after 4 spliced writes, want 0", f)
			}
			tc.act(h)
			if len(h.taint) == 0 {
				t.Fatal("nothing tainted")
			}
			h.pump()
			err, ok := h.done[1]
			if !ok || (tc.wantErr == nil && err != nil) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("done %v err %v, want %v", ok, err, tc.wantErr)
			}
			if !h.retired[1] {
				t.Error("transfer never retired")
			}
			credits := 6
			switch tc.name {
			case "session down":
				credits = -1 // the session is gone
			case "all streams lost":
				credits = -1 // as without splice: the session closes next
			}
			h.settled(credits)
		})
	}
}

// The receiver's answer may be about a copy the core gave up (a ghost that
// arrived after all) while a newer copy of the chunk is still in a socket:
// the newer copy's slot must then be renewed, not freed.
func TestSpliceGhostAnswerTaints(t *testing.T) {
	h := newSpliceHarness(t, 2)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 2, Credits: 4})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 1)})
	h.finishCopies(nil)
	h.writeAll()
	ghost := h.wire[0]
	h.loseStream(1, ghost.Stream)
	h.renewAll()
	h.finishCopies(nil)
	h.writeAll()
	if len(h.wire) != 1 {
		t.Fatalf("%d copies on the wire, want the one sent again", len(h.wire))
	}
	again := h.wire[0]
	// The ghost's Ack arrives; the second copy is still unread.
	h.limbo = append(h.limbo[:0], again)
	h.wire = nil
	h.step(Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: []uint32{ghost.Chunk}})
	if !slices.Equal(h.taint, []SendSlot{again.Slot}) {
		t.Fatalf("taint %v after the ghost's ack, want the second copy's slot %d", h.taint, again.Slot)
	}
	if err, ok := h.done[1]; !ok || err != nil {
		t.Fatalf("done %v err %v, want success", ok, err)
	}
	h.renewAll()
	h.settled(-1)
}

// A spliced chunk's write is often reported after the receiver's Ack (they
// reach the core by different paths). The Ack proves this copy was read, so
// its slot is freed, unless an earlier copy was given up unanswered (the
// Ack may be that ghost's) or no answer came (the transfer was cancelled):
// then it is tainted.
func TestSpliceAnsweredBeforeWritten(t *testing.T) {
	for _, tc := range []struct {
		name      string
		chunks    int
		before    func(h *spliceHarness, c SendCmd) // between the send and its write report
		wantTaint bool
		wantDone  bool
	}{
		{name: "acked, transfer done", chunks: 1, wantDone: true, before: func(h *spliceHarness, c SendCmd) {
			h.step(Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: []uint32{c.Chunk}})
		}},
		{name: "acked, transfer going on", chunks: 3, before: func(h *spliceHarness, c SendCmd) {
			h.step(Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: []uint32{c.Chunk}})
		}},
		{name: "cancelled unanswered", chunks: 1, wantTaint: true, wantDone: true, before: func(h *spliceHarness, c SendCmd) {
			h.step(Event{Kind: EvCancel, Transfer: 1})
		}},
		{name: "acked after a ghost", chunks: 1, wantTaint: true, wantDone: true, before: func(h *spliceHarness, c SendCmd) {
			// The earlier copy of the chunk went down with its stream.
			h.s.xfers[1].markGhost(c.Chunk)
			h.step(Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: []uint32{c.Chunk}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newSpliceHarness(t, 2)
			h.step(Event{Kind: EvSessionUp, Session: 1, N: 1, Credits: 2})
			h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, tc.chunks)})
			h.finishCopies(nil)
			c := h.sends[0]
			h.sends = h.sends[1:]
			tc.before(h, c)
			h.step(Event{Kind: EvWritten, Transfer: 1, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream, Spliced: true})
			if got := slices.Contains(h.taint, c.Slot); got != tc.wantTaint {
				t.Fatalf("slot %d tainted: %v (taint %v), want %v", c.Slot, got, h.taint, tc.wantTaint)
			}
			if _, done := h.done[1]; done != tc.wantDone {
				t.Fatalf("transfer done: %v, want %v", done, tc.wantDone)
			}
			if !tc.wantTaint && !slices.Contains(h.s.free, c.Slot) && !slices.ContainsFunc(h.copies, func(n CopyCmd) bool { return n.Slot == c.Slot }) {
				t.Fatalf("slot %d neither tainted, free (%v) nor carrying the next chunk", c.Slot, h.s.free)
			}
			h.renewAll()
			h.pump()
		})
	}
}

// A renewal that fails loses the slot for good; the core works on with
// the rest and says how many it has.
func TestSpliceRenewalFails(t *testing.T) {
	h := newSpliceHarness(t, 2)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 1, Credits: 2})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 4)})
	h.finishCopies(nil)
	h.writeAll()
	h.step(Event{Kind: EvCancel, Transfer: 1})
	if len(h.taint) != 2 {
		t.Fatalf("taint %v, want both slots", h.taint)
	}
	h.step(Event{Kind: EvRenewed, Slot: h.taint[0], Err: errors.New("ENOMEM")})
	h.gen[h.taint[1]]++
	h.step(Event{Kind: EvRenewed, Slot: h.taint[1]})
	h.taint = nil
	if h.s.Slots() != 1 || h.s.FreeSlots() != 1 || h.s.Renewing() != 0 {
		t.Fatalf("slots %d free %d renewing %d, want 1 1 0", h.s.Slots(), h.s.FreeSlots(), h.s.Renewing())
	}
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 2, Plan: plan(t, 3)})
	h.wire = nil
	h.step(Event{Kind: EvCredit, Session: 1, Credits: 2})
	h.pump()
	if err, ok := h.done[2]; !ok || err != nil {
		t.Fatalf("transfer 2 on the slot left: done=%v err=%v, want success", ok, err)
	}
}

// Random schedules of writes, answers (some from ghosts), resends, lost
// and returning streams, cancels and renewals: no slot is ever gathered
// into while an unread copy references its pages, and at the end every
// slot is home.
func TestSpliceRandom(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		h := newSpliceHarness(t, 4)
		r := rand.New(rand.NewPCG(seed, 7))
		h.step(Event{Kind: EvSessionUp, Session: 1, N: 3, Credits: 6})
		for x := uint64(1); x <= 3; x++ {
			h.step(Event{Kind: EvSubmit, Session: 1, Transfer: Key(x), Plan: plan(t, 1+r.IntN(12))})
		}
		for i := 0; i < 300; i++ {
			h.randomStep(r)
		}
		for i := 0; i < 100 && len(h.done) < 3; i++ {
			for st := 0; st < 3; st++ {
				h.step(Event{Kind: EvStreamUp, Session: 1, Stream: st})
			}
			h.pump()
			h.step(Event{Kind: EvCredit, Session: 1, Credits: 1}) // answers lost with the ghosts
		}
		h.pump()
		if len(h.done) != 3 {
			t.Fatalf("seed %d: %d of 3 transfers finished", seed, len(h.done))
		}
		h.settled(-1)
		if t.Failed() {
			t.Fatalf("seed %d", seed)
		}
	}
}

func (h *spliceHarness) randomStep(r *rand.Rand) {
	switch k := r.IntN(10); {
	case k < 2 && len(h.copies) > 0:
		c := h.copies[0]
		h.copies = h.copies[1:]
		h.step(Event{Kind: EvCopyDone, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot})
	case k < 4 && len(h.sends) > 0:
		i := r.IntN(len(h.sends))
		c := h.sends[i]
		h.sends = slices.Delete(h.sends, i, i+1)
		var err error
		if r.IntN(8) == 0 {
			err = errors.New("write failed")
			h.limbo = append(h.limbo, wcopy{SendCmd: c, gen: h.gen[c.Slot]})
		} else {
			h.wire = append(h.wire, wcopy{SendCmd: c, gen: h.gen[c.Slot]})
		}
		h.step(Event{Kind: EvWritten, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream, Spliced: true, Err: err})
	case k < 4 && len(h.unreported) > 0 && r.IntN(2) == 0:
		i := r.IntN(len(h.unreported))
		c := h.unreported[i]
		h.unreported = slices.Delete(h.unreported, i, i+1)
		h.step(Event{Kind: EvWritten, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream, Spliced: true})
	case k < 4 && len(h.sends) > 0 && r.IntN(3) == 0:
		// On the wire now, its report later.
		i := r.IntN(len(h.sends))
		c := h.sends[i]
		h.sends = slices.Delete(h.sends, i, i+1)
		h.wire = append(h.wire, wcopy{SendCmd: c, gen: h.gen[c.Slot]})
		h.unreported = append(h.unreported, c)
	case k < 6 && len(h.wire) > 0:
		w := h.wire[r.IntN(len(h.wire))]
		h.answer(func(o wcopy) bool { return o == w }, r.IntN(6) == 0)
	case k == 6 && len(h.limbo) > 0:
		// A ghost arrives after all and is answered: the receiver read it,
		// so its pages are no longer referenced.
		i := r.IntN(len(h.limbo))
		w := h.limbo[i]
		h.limbo = slices.Delete(h.limbo, i, i+1)
		h.step(Event{Kind: EvAck, Session: w.Session, Transfer: w.Transfer, Chunks: []uint32{w.Chunk}})
	case k == 7 && r.IntN(4) == 0:
		st := r.IntN(3)
		h.loseStream(1, st)
		h.step(Event{Kind: EvStreamUp, Session: 1, Stream: r.IntN(3)})
	case k == 8:
		h.renewAll()
	case k == 9 && r.IntN(20) == 0:
		h.step(Event{Kind: EvCancel, Transfer: Key(1 + r.Uint64N(3))})
	}
}
