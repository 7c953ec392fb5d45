package staging

import (
	"errors"
	"testing"
	"time"

	"github.com/stage-kv/stage/device"
)

// harness drives a Sender like the proxy would, with the device and the
// network replaced by lists the test controls.
type harness struct {
	t       *testing.T
	s       *Sender
	now     time.Time
	copies  []CopyCmd
	sends   []SendCmd
	written []SendCmd // on the wire, not acked
	done    map[Key]error
	retired map[Key]bool
	maxOut  int // most chunks in flight (copying + sending + unacked) seen
	// onReady, when set, sees each Ready before the harness files it.
	onReady func(r *Ready)
	last    Event // the event being stepped
}

func newHarness(t *testing.T, slots int) *harness {
	return &harness{t: t, s: NewSender(slots), now: time.Unix(1000, 0), done: map[Key]error{}, retired: map[Key]bool{}}
}

func (h *harness) step(ev Event) {
	h.t.Helper()
	if ev.Now.IsZero() {
		ev.Now = h.now
	}
	h.last = ev
	r := h.s.Step(ev)
	if h.onReady != nil {
		h.onReady(r)
	} else if len(r.Taint) > 0 {
		h.t.Fatalf("slots %v tainted though nothing was spliced", r.Taint)
	}
	h.copies = append(h.copies, r.Copies...)
	h.sends = append(h.sends, r.Sends...)
	for _, d := range r.Done {
		if _, dup := h.done[d.Transfer]; dup {
			h.t.Fatalf("transfer %d completed twice", d.Transfer)
		}
		h.done[d.Transfer] = d.Err
	}
	for _, k := range r.Retired {
		h.retired[k] = true
	}
	if out := len(h.copies) + len(h.sends) + len(h.written); out > h.maxOut {
		h.maxOut = out
	}
}

func plan(t *testing.T, chunks int) *Plan {
	t.Helper()
	p, err := MakePlan([]PlanOp{{Src: 4096, Len: uint64(chunks) * 8}}, 8)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// finishCopies completes every pending copy.
func (h *harness) finishCopies(err error) {
	cs := h.copies
	h.copies = nil
	for _, c := range cs {
		h.step(Event{Kind: EvCopyDone, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Err: err})
	}
}

// finishSends reports every pending send written.
func (h *harness) finishSends(err error) {
	ss := h.sends
	h.sends = nil
	for _, c := range ss {
		if err == nil {
			h.written = append(h.written, c)
		}
		h.step(Event{Kind: EvWritten, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream, Err: err})
	}
}

// ackAll acks every written chunk.
func (h *harness) ackAll() {
	ws := h.written
	h.written = nil
	for _, c := range ws {
		h.step(Event{Kind: EvAck, Session: c.Session, Transfer: c.Transfer, Chunks: []uint32{c.Chunk}})
	}
}

// run pumps until nothing moves.
func (h *harness) run() {
	for i := 0; i < 10000 && (len(h.copies)+len(h.sends)+len(h.written) > 0); i++ {
		h.finishCopies(nil)
		h.finishSends(nil)
		h.ackAll()
	}
}

func (h *harness) idle() {
	h.t.Helper()
	if f := h.s.FreeSlots(); f != h.s.slots {
		h.t.Errorf("free slots %d, want all %d", f, h.s.slots)
	}
	if a := h.s.Active(); a != 0 {
		h.t.Errorf("active transfers %d, want 0", a)
	}
}

func TestSenderCompletes(t *testing.T) {
	for _, tc := range []struct {
		name           string
		slots, credits int
		chunks         int
		streams        int
	}{
		{"credits bind", 8, 2, 10, 1},
		{"slots bind", 2, 16, 10, 4},
		{"one chunk", 4, 4, 1, 2},
		{"many", 16, 16, 500, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.slots)
			h.step(Event{Kind: EvSessionUp, Session: 1, N: tc.streams, Credits: tc.credits})
			h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 7, Plan: plan(t, tc.chunks)})
			h.run()
			err, ok := h.done[7]
			if !ok || err != nil {
				t.Fatalf("got done=%v err=%v, want success", ok, err)
			}
			if !h.retired[7] {
				t.Error("transfer not retired")
			}
			if lim := min(tc.slots, tc.credits); h.maxOut > max(lim, tc.credits) {
				t.Errorf("up to %d chunks in flight, credits %d", h.maxOut, tc.credits)
			}
			h.idle()
		})
	}
}

func TestSenderNeverExceedsCredits(t *testing.T) {
	h := newHarness(t, 64)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 2, Credits: 3})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 20)})
	h.finishCopies(nil)
	h.finishSends(nil)
	if len(h.written) != 3 || len(h.copies) != 0 {
		t.Fatalf("got %d written, %d copying without acks; want 3 and 0", len(h.written), len(h.copies))
	}
	h.step(Event{Kind: EvCredit, Session: 1, Credits: 2})
	if len(h.copies) != 2 {
		t.Fatalf("after 2 more credits got %d copies, want 2", len(h.copies))
	}
	h.run()
	if err := h.done[1]; err != nil {
		t.Fatal(err)
	}
	h.idle()
}

func TestSenderStripesChunks(t *testing.T) {
	h := newHarness(t, 8)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 4, Credits: 8})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 8)})
	h.finishCopies(nil)
	used := map[int]int{}
	for _, s := range h.sends {
		used[s.Stream]++
	}
	if len(used) != 4 {
		t.Fatalf("8 chunks went on streams %v, want all 4 used", used)
	}
	h.run()
	h.idle()
}

func TestSenderStreamLostResends(t *testing.T) {
	h := newHarness(t, 8)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 2, Credits: 4})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 4)})
	h.finishCopies(nil)
	h.finishSends(nil)
	// Stream 1 dies with its chunks unacked: they must go again on stream 0.
	var lost []uint32
	var keep []SendCmd
	for _, w := range h.written {
		if w.Stream == 1 {
			lost = append(lost, w.Chunk)
		} else {
			keep = append(keep, w)
		}
	}
	h.written = keep
	if len(lost) == 0 {
		t.Fatal("nothing went on stream 1")
	}
	h.step(Event{Kind: EvStreamLost, Session: 1, Stream: 1, Err: errors.New("reset")})
	if len(h.copies) != len(lost) {
		t.Fatalf("got %d copies after losing %d chunks, want them all again", len(h.copies), len(lost))
	}
	h.finishCopies(nil)
	for _, s := range h.sends {
		if s.Stream != 0 {
			t.Fatalf("resent on stream %d, want 0", s.Stream)
		}
	}
	h.run()
	if err := h.done[1]; err != nil {
		t.Fatal(err)
	}
	h.idle()
}

func TestSenderFailures(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		act  func(h *harness)
		want error
	}{
		{"all streams lost", func(h *harness) {
			h.step(Event{Kind: EvStreamLost, Session: 1, Stream: 0, Err: boom})
			h.step(Event{Kind: EvStreamLost, Session: 1, Stream: 1, Err: boom})
		}, ErrNoStreams},
		{"write error on last stream", func(h *harness) {
			h.step(Event{Kind: EvStreamLost, Session: 1, Stream: 1, Err: boom})
			h.finishSends(boom)
		}, ErrNoStreams},
		{"copy fails", func(h *harness) {
			h.finishSends(nil)
			h.ackAll()
			h.finishCopies(boom)
		}, boom},
		{"nack", func(h *harness) { h.step(Event{Kind: EvNack, Session: 1, Transfer: 1, Err: boom}) }, boom},
		{"nack from another session is ignored", func(h *harness) {
			h.step(Event{Kind: EvSessionUp, Session: 2, N: 1, Credits: 4})
			h.step(Event{Kind: EvNack, Session: 2, Transfer: 1, Err: boom})
			h.now = h.now.Add(2 * time.Second)
			h.step(Event{Kind: EvTick})
		}, ErrTimeout},
		{"cancel", func(h *harness) { h.step(Event{Kind: EvCancel, Transfer: 1}) }, ErrCancelled},
		{"session down", func(h *harness) { h.step(Event{Kind: EvSessionDown, Session: 1, Err: boom}) }, boom},
		{"no progress", func(h *harness) {
			h.now = h.now.Add(2 * time.Second)
			h.step(Event{Kind: EvTick})
		}, ErrTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 4)
			h.step(Event{Kind: EvSessionUp, Session: 1, N: 2, Credits: 4})
			h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 10), Timeout: time.Second})
			h.finishCopies(nil) // now some chunks are being sent
			tc.act(h)
			err, ok := h.done[1]
			if !ok || !errors.Is(err, tc.want) {
				t.Fatalf("got done=%v err=%v, want %v", ok, err, tc.want)
			}
			// Whatever was in flight still comes back; then all is free.
			h.finishCopies(nil)
			h.finishSends(nil)
			h.ackAll()
			if !h.retired[1] {
				t.Error("failed transfer never retired")
			}
			h.idle()
		})
	}
}

func TestSenderProgressResetsDeadline(t *testing.T) {
	h := newHarness(t, 2)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 1, Credits: 2})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 6), Timeout: time.Second})
	for i := 0; i < 3; i++ {
		h.now = h.now.Add(900 * time.Millisecond)
		h.finishCopies(nil)
		h.finishSends(nil)
		h.ackAll()
		h.step(Event{Kind: EvTick})
	}
	if err, ok := h.done[1]; !ok || err != nil {
		t.Fatalf("got done=%v err=%v, want success: acks kept it alive", ok, err)
	}
}

func TestSenderAckBeforeWritten(t *testing.T) {
	h := newHarness(t, 2)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 1, Credits: 2})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 1)})
	h.finishCopies(nil)
	c := h.sends[0]
	h.sends = nil
	h.step(Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: []uint32{c.Chunk}})
	if err, ok := h.done[1]; !ok || err != nil {
		t.Fatalf("got done=%v err=%v after the ack", ok, err)
	}
	if h.retired[1] {
		t.Fatal("retired while its slot was still being written")
	}
	h.step(Event{Kind: EvWritten, Transfer: 1, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream})
	if !h.retired[1] {
		t.Fatal("not retired after the write finished")
	}
	h.idle()
}

func TestSenderFairness(t *testing.T) {
	// One slot, one credit: copies alternate between the two transfers.
	h2 := newHarness(t, 1)
	h2.step(Event{Kind: EvSessionUp, Session: 1, N: 1, Credits: 1})
	h2.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 4)})
	h2.step(Event{Kind: EvSubmit, Session: 1, Transfer: 2, Plan: plan(t, 4)})
	var seq []Key
	for i := 0; i < 8 && len(h2.copies) > 0; i++ {
		seq = append(seq, h2.copies[0].Transfer)
		h2.finishCopies(nil)
		h2.finishSends(nil)
		h2.ackAll()
	}
	for i := 1; i < len(seq)-1; i++ {
		if seq[i] == seq[i-1] && seq[i] == seq[i+1] {
			t.Fatalf("chunk order %v: one transfer ran three in a row while the other waited", seq)
		}
	}
	if len(seq) != 8 {
		t.Fatalf("got %d chunk starts, want 8", len(seq))
	}
}

func TestSenderRejects(t *testing.T) {
	h := newHarness(t, 2)
	h.step(Event{Kind: EvSubmit, Session: 9, Transfer: 1, Plan: plan(t, 1)})
	if !errors.Is(h.done[1], ErrNoSession) || !h.retired[1] {
		t.Fatalf("submit on unknown session: got %v, retired %v", h.done[1], h.retired[1])
	}
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 1, Credits: 0})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 2, Plan: plan(t, 1)})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 2, Plan: plan(t, 1)})
	if !errors.Is(h.done[2], ErrDuplicateID) {
		t.Fatalf("duplicate id: got %v", h.done[2])
	}
}

// BenchmarkSenderChunk measures the core's cost per chunk (copy, write,
// ack), which must not allocate in steady state.
func BenchmarkSenderChunk(b *testing.B) {
	s := NewSender(16)
	s.Step(Event{Kind: EvSessionUp, Session: 1, N: 4, Credits: 16})
	p, _ := MakePlan([]PlanOp{{Src: device.Addr(1), Len: uint64(b.N+1) * 8}}, 8)
	r := s.Step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: p})
	pend := append([]CopyCmd(nil), r.Copies...)
	b.ReportAllocs()
	b.ResetTimer()
	var chunks [1]uint32
	for i := 0; i < b.N; i++ {
		c := pend[0]
		pend = pend[1:]
		r := s.Step(Event{Kind: EvCopyDone, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot})
		sd := r.Sends[0]
		r = s.Step(Event{Kind: EvWritten, Transfer: sd.Transfer, Chunk: sd.Chunk, Slot: sd.Slot, Stream: sd.Stream})
		pend = append(pend, r.Copies...)
		chunks[0] = sd.Chunk
		r = s.Step(Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: chunks[:]})
		pend = append(pend, r.Copies...)
	}
}

// TestSenderDepth: with a depth, no more chunks per live stream are copied
// or queued ahead of the sockets than it allows, however many slots and
// credits there are; the transfer still completes.
func TestSenderDepth(t *testing.T) {
	for _, tc := range []struct {
		depth, streams, want int
	}{
		{1, 2, 2},
		{2, 3, 6},
		{0, 2, 15}, // no limit: slots (16) less the reserve (1) bound it
	} {
		h := newHarness(t, 16)
		h.s = NewSenderDepth(16, tc.depth)
		h.step(Event{Kind: EvSessionUp, Session: 1, N: tc.streams, Credits: 64})
		h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 7, Plan: plan(t, 100)})
		if got := len(h.copies); got != tc.want {
			t.Errorf("depth %d, %d streams: %d copies started, want %d", tc.depth, tc.streams, got, tc.want)
		}
		h.finishCopies(nil)
		if got := len(h.sends) + len(h.copies); got != tc.want {
			t.Errorf("depth %d, %d streams: %d chunks ahead after the copies, want %d", tc.depth, tc.streams, got, tc.want)
		}
		h.run()
		if err, ok := h.done[7]; !ok || err != nil {
			t.Errorf("depth %d: transfer done %v, err %v", tc.depth, ok, err)
		}
		h.idle()
	}
}

// A chunk whose write is reported done after its stream was already
// given up (the loss handled first) may never arrive: it goes again on a
// live stream, and its credit comes back, instead of waiting for an Ack
// until the progress deadline.
func TestSenderWrittenAfterStreamLost(t *testing.T) {
	h := newHarness(t, 8)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 2, Credits: 4})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 4), Timeout: time.Second})
	h.finishCopies(nil)
	var late []SendCmd
	var rest []SendCmd
	for _, c := range h.sends {
		if c.Stream == 1 {
			late = append(late, c)
		} else {
			rest = append(rest, c)
		}
	}
	if len(late) == 0 {
		t.Fatal("nothing went on stream 1")
	}
	h.sends = rest
	h.step(Event{Kind: EvStreamLost, Session: 1, Stream: 1, Err: errors.New("reset")})
	for _, c := range late { // the writer finished into the dead socket
		h.step(Event{Kind: EvWritten, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream})
	}
	h.run()
	if err, ok := h.done[1]; !ok || err != nil {
		t.Fatalf("transfer: done %v, err %v; want done without error before any deadline", ok, err)
	}
	if c := h.s.Credits(1); c != 4 {
		t.Errorf("credits %d after the transfer, want the 4 granted", c)
	}
	h.idle()
}
