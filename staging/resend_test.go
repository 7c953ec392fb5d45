package staging

import (
	"errors"
	"strings"
	"testing"
)

// takeSend removes chunk c's command from cmds and returns it.
func takeSend(t *testing.T, cmds *[]SendCmd, c uint32) SendCmd {
	t.Helper()
	for i, s := range *cmds {
		if s.Chunk == c {
			*cmds = append((*cmds)[:i], (*cmds)[i+1:]...)
			return s
		}
	}
	t.Fatalf("chunk %d is not among %+v", c, *cmds)
	return SendCmd{}
}

// writeOne reports chunk c's pending send written.
func (h *harness) writeOne(c uint32) SendCmd {
	h.t.Helper()
	s := takeSend(h.t, &h.sends, c)
	h.written = append(h.written, s)
	h.step(Event{Kind: EvWritten, Transfer: s.Transfer, Chunk: s.Chunk, Slot: s.Slot, Stream: s.Stream})
	return s
}

func (h *harness) wantCredits(want int) {
	h.t.Helper()
	if got := h.s.Credits(1); got != want {
		h.t.Fatalf("session 1 has %d credits, want %d", got, want)
	}
}

// A chunk the receiver found damaged is gathered and sent again; the
// Resend returns its credit, so credits end where they began.
func TestSenderResendDamaged(t *testing.T) {
	h := newHarness(t, 8)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 2, Credits: 4})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 4)})
	h.finishCopies(nil)
	h.finishSends(nil)
	h.wantCredits(0)
	bad := takeSend(t, &h.written, 2)
	h.step(Event{Kind: EvResend, Session: 1, Transfer: 1, Chunk: bad.Chunk})
	if len(h.copies) != 1 || h.copies[0].Chunk != 2 {
		t.Fatalf("after a Resend of chunk 2 got copies %+v, want chunk 2 again", h.copies)
	}
	h.run()
	if err, ok := h.done[1]; !ok || err != nil {
		t.Fatalf("transfer: done %v, err %v; want success", ok, err)
	}
	h.wantCredits(4)
	h.idle()
}

// A chunk damaged on every try fails the transfer after MaxResends, with
// an error naming the chunk; every credit comes back.
func TestSenderResendBound(t *testing.T) {
	h := newHarness(t, 8)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 1, Credits: 4})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 3)})
	answered := 0
	for i := 0; i < 100 && len(h.done) == 0; i++ {
		h.finishCopies(nil)
		h.finishSends(nil)
		ws := h.written
		h.written = nil
		for _, w := range ws {
			if w.Chunk == 1 {
				h.step(Event{Kind: EvResend, Session: 1, Transfer: 1, Chunk: 1})
				answered++
			} else {
				h.step(Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: []uint32{w.Chunk}})
			}
		}
	}
	err, ok := h.done[1]
	if !ok || !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "chunk 1 of 3") {
		t.Fatalf("got done %v, %v; want ErrDamaged naming chunk 1 of 3", ok, err)
	}
	if answered != MaxResends+1 {
		t.Fatalf("chunk 1 was sent %d times, want %d", answered, MaxResends+1)
	}
	h.run()
	h.wantCredits(4)
	h.idle()
}

// Credits stay balanced when a chunk the core gave up on (its stream was
// lost, its credit refunded) had landed after all: its Ack must not return
// the credit a second time, whether it comes before the chunk is sent
// again or while the second copy is on its way (which the receiver, having
// the chunk, then answers with nothing).
func TestSenderCreditsAfterLoss(t *testing.T) {
	for _, tc := range []struct {
		name string
		// ackFirst: the late Ack arrives while the chunk waits for a slot.
		ackFirst bool
	}{
		{"ack before the chunk goes again", true},
		{"ack while the second copy is on its way", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 2)
			h.step(Event{Kind: EvSessionUp, Session: 1, N: 2, Credits: 8})
			h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 3)})
			h.finishCopies(nil) // chunks 0 and 1 on streams 0 and 1
			first := h.writeOne(1)
			// chunk 2 took the freed slot; chunk 0 still holds the other.
			if first.Stream != 1 || len(h.copies) != 1 {
				t.Fatalf("setup: chunk 1 on stream %d, %d copies; want stream 1, 1 copy", first.Stream, len(h.copies))
			}
			h.step(Event{Kind: EvStreamLost, Session: 1, Stream: 1, Err: errors.New("reset")})
			h.written = slicesDelete(h.written, 1) // its Ack is the late one below
			h.wantCredits(8 - 3 + 1)               // three chunks out, chunk 1 refunded
			late := Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: []uint32{1}}
			if tc.ackFirst {
				h.step(late)
				h.wantCredits(6) // no credit: chunk 1 was refunded
				h.run()
			} else {
				h.finishCopies(nil) // chunk 2 gathered
				h.writeOne(2)       // its slot frees: chunk 1 starts again
				h.finishCopies(nil)
				if len(h.sends) != 2 || h.sends[1].Chunk != 1 {
					t.Fatalf("setup: sends %+v, want chunks 0 and 1", h.sends)
				}
				h.step(late)
				h.wantCredits(8 - 4 + 1 + 1) // four copies out, one refund, one ack
				h.finishSends(nil)
				// The receiver has chunk 1 already: it answers the copy
				// with nothing.
				h.written = slicesDelete(h.written, 1)
				h.run()
			}
			if err, ok := h.done[1]; !ok || err != nil {
				t.Fatalf("transfer: done %v, err %v; want success", ok, err)
			}
			h.wantCredits(8)
			h.idle()
		})
	}
}

// slicesDelete drops the written commands of chunk c.
func slicesDelete(ws []SendCmd, c uint32) []SendCmd {
	out := ws[:0]
	for _, w := range ws {
		if w.Chunk != c {
			out = append(out, w)
		}
	}
	return out
}

// A stream that comes back (EvStreamUp after EvStreamLost) carries chunks
// again.
func TestSenderStreamComesBack(t *testing.T) {
	h := newHarness(t, 8)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 2, Credits: 8})
	h.step(Event{Kind: EvStreamLost, Session: 1, Stream: 1, Err: errors.New("reset")})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 4)})
	h.finishCopies(nil)
	for _, s := range h.sends {
		if s.Stream != 0 {
			t.Fatalf("chunk %d went on lost stream %d", s.Chunk, s.Stream)
		}
	}
	h.run()
	h.step(Event{Kind: EvStreamUp, Session: 1, Stream: 1})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 2, Plan: plan(t, 4)})
	h.finishCopies(nil)
	used := map[int]int{}
	for _, s := range h.sends {
		used[s.Stream]++
	}
	if used[1] == 0 {
		t.Fatalf("after the stream came back chunks went on %v, want stream 1 used", used)
	}
	h.run()
	h.wantCredits(8)
	h.idle()
}
