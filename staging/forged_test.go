package staging

import (
	"testing"
	"time"
)

// An answer (Ack or Resend) about a chunk that does not exist, was never
// sent, was answered already, or belongs to another session's transfer,
// changes nothing: no credit, no progress (PROTOCOL 8.7). With one credit,
// chunk 1 must not start before chunk 0 is truly acked.
func TestSenderIgnoresForgedAnswers(t *testing.T) {
	for _, tc := range []struct {
		name string
		ev   Event
	}{
		{"ack of chunk 2^32-1", Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: []uint32{1<<32 - 1}}},
		{"ack of chunk 1000", Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: []uint32{1000}}},
		{"ack of a chunk never sent", Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: []uint32{2}}},
		{"ack of many chunks never sent", Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: []uint32{1, 2, 3, 3, 3}}},
		{"ack of an unknown transfer", Event{Kind: EvAck, Session: 1, Transfer: 99, Chunks: []uint32{0}}},
		{"ack from another session", Event{Kind: EvAck, Session: 2, Transfer: 1, Chunks: []uint32{0}}},
		{"resend of chunk 1000", Event{Kind: EvResend, Session: 1, Transfer: 1, Chunk: 1000}},
		{"resend of a chunk never sent", Event{Kind: EvResend, Session: 1, Transfer: 1, Chunk: 3}},
		{"resend of an unknown transfer", Event{Kind: EvResend, Session: 1, Transfer: 99, Chunk: 0}},
		{"resend from another session", Event{Kind: EvResend, Session: 2, Transfer: 1, Chunk: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 4)
			h.step(Event{Kind: EvSessionUp, Session: 1, N: 1, Credits: 1})
			h.step(Event{Kind: EvSessionUp, Session: 2, N: 1, Credits: 0})
			h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 4)})
			h.finishCopies(nil)
			h.writeOne(0)
			h.wantCredits(0)
			h.step(tc.ev)
			h.wantCredits(0)
			if got := h.s.Credits(2); got != 0 {
				t.Fatalf("session 2 has %d credits after a forged answer, want 0", got)
			}
			if len(h.copies) != 0 {
				t.Fatalf("a forged answer started chunk %d", h.copies[0].Chunk)
			}
			if _, ok := h.done[1]; ok {
				t.Fatal("a forged answer finished the transfer")
			}
			// The real Ack returns the credit once; a repeat returns none.
			ack := Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: []uint32{0}}
			h.written = nil
			h.step(ack)
			if len(h.copies) != 1 || h.copies[0].Chunk != 1 {
				t.Fatalf("after the real ack: copies %+v, want chunk 1", h.copies)
			}
			h.step(ack)
			h.wantCredits(0)
			h.run()
			if err, ok := h.done[1]; !ok || err != nil {
				t.Fatalf("transfer: done %v, err %v; want success", ok, err)
			}
			h.wantCredits(1)
			h.idle()
		})
	}
}

// A transfer that failed with chunks on the wire still gets their credits
// back when their Acks come late, after it retired: exactly once each, and
// only for chunks that were sent.
func TestSenderLateAckAfterRetire(t *testing.T) {
	h := newHarness(t, 4)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 1, Credits: 3})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 8), Timeout: time.Second})
	h.finishCopies(nil)
	h.finishSends(nil) // chunks 0, 1 and 2 on the wire
	h.wantCredits(0)
	h.now = h.now.Add(2 * time.Second)
	h.step(Event{Kind: EvTick})
	if _, ok := h.done[1]; !ok || !h.retired[1] {
		t.Fatalf("setup: done %v retired %v, want both", ok, h.retired[1])
	}
	for _, tc := range []struct {
		chunks []uint32
		want   int
	}{
		{[]uint32{0}, 1},
		{[]uint32{0}, 1},       // answered already
		{[]uint32{5, 7, 9}, 1}, // never sent
		{[]uint32{1, 1, 2}, 3},
		{[]uint32{2}, 3},
	} {
		h.step(Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: tc.chunks})
		h.wantCredits(tc.want)
	}
}
