package staging

import (
	"slices"
	"testing"
)

// queue2 is the queue the tests set: the one being written and one behind.
const queue2 = 2

// queueHarness is a core of 13 send slots (12 usable by one session: the
// reserve is 0 below 16), no stream_depth, the given queue, one session of
// streams data streams and 12 credits, and transfer 1 of chunks chunks
// submitted.
func queueHarness(t *testing.T, queue, streams, chunks int) *harness {
	h := newHarness(t, 13)
	h.s = NewSenderDepth(13, 0)
	h.s.SetStreamQueue(queue)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: streams, Credits: 12})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, chunks)})
	return h
}

// streamsOf counts the pending sends per stream.
func streamsOf(sends []SendCmd) map[int]int {
	n := map[int]int{}
	for _, s := range sends {
		n[s.Stream]++
	}
	return n
}

// A gathered chunk goes to a stream only while that stream holds fewer
// than the queue unwritten; the rest wait, oldest first, for whichever
// stream writes first. queue 0 hands every chunk over at once (the rule
// before dispatch.go).
func TestSenderStreamQueue(t *testing.T) {
	for _, tc := range []struct {
		name          string
		queue         int
		streams       int
		wantHanded    int // sends after the first copies finish
		wantPerStream int // most on one stream
	}{
		{"queue 2, 2 streams", 2, 2, 4, 2},
		{"queue 1, 3 streams", 1, 3, 3, 1},
		{"queue 2, 8 streams", 2, 8, 12, 2}, // room for 16: all 12 handed
		{"no limit, 2 streams", 0, 2, 12, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := queueHarness(t, tc.queue, tc.streams, 40)
			if len(h.copies) != 12 {
				t.Fatalf("%d copies started, want 12", len(h.copies))
			}
			h.finishCopies(nil)
			if len(h.sends) != tc.wantHanded {
				t.Fatalf("%d chunks handed to streams, want %d (%v)", len(h.sends), tc.wantHanded, streamsOf(h.sends))
			}
			for st, n := range streamsOf(h.sends) {
				if n > tc.wantPerStream {
					t.Fatalf("stream %d holds %d unwritten chunks, want at most %d", st, n, tc.wantPerStream)
				}
			}
			h.run()
			if err, ok := h.done[1]; !ok || err != nil {
				t.Fatalf("transfer done %v, err %v", ok, err)
			}
			h.idle()
		})
	}
}

// The end of a transfer: one stream stalls (its writes never finish) while
// the other keeps writing. The chunks that wait go to the stream that
// writes, in the order they were gathered; the stalled one keeps only what
// it was handed.
func TestSenderWaitingGoToTheFreeStream(t *testing.T) {
	h := queueHarness(t, queue2, 2, 10)
	h.finishCopies(nil)
	const stalled = 0 // stream 0 never reports a write
	var order []uint32
	for i := 0; i < 20; i++ {
		i := slices.IndexFunc(h.sends, func(s SendCmd) bool { return s.Stream != stalled })
		if i < 0 {
			break
		}
		order = append(order, h.sends[i].Chunk)
		h.writeOne(h.sends[i].Chunk)
	}
	if n := streamsOf(h.sends)[stalled]; n != queue2 {
		t.Fatalf("the stalled stream holds %d chunks, want %d", n, queue2)
	}
	if len(order) != 10-queue2 {
		t.Fatalf("the free stream wrote %d chunks (%v), want %d", len(order), order, 10-queue2)
	}
	if !slices.IsSorted(order) {
		t.Fatalf("chunks went in the order %v, want the order they were gathered", order)
	}
	h.run()
	if err, ok := h.done[1]; !ok || err != nil {
		t.Fatalf("transfer done %v, err %v", ok, err)
	}
	h.idle()
}

// A transfer that fails while chunks of it wait for a stream gives their
// slots and credits back at once; it retires once the chunks it handed
// over are written, and a transfer behind it still completes.
func TestSenderWaitingDroppedOnFailure(t *testing.T) {
	h := queueHarness(t, queue2, 1, 30)
	h.finishCopies(nil)
	if len(h.sends) != queue2 {
		t.Fatalf("%d sends, want %d", len(h.sends), queue2)
	}
	free := h.s.FreeSlots()
	h.step(Event{Kind: EvCancel, Transfer: 1})
	if err := h.done[1]; err == nil {
		t.Fatal("cancelled transfer reported no error")
	}
	if got, want := h.s.FreeSlots(), free+12-queue2; got != want {
		t.Fatalf("%d free slots after the cancel, want %d (the waiting chunks' slots back)", got, want)
	}
	if h.retired[1] {
		t.Fatal("retired while two of its chunks were still being written")
	}
	h.wantCredits(12 - queue2)
	h.finishSends(nil)
	if !h.retired[1] {
		t.Fatal("not retired after its last writes")
	}
	h.written = nil // their Acks would come to a retired transfer (forged_test.go)
	h.step(Event{Kind: EvCredit, Session: 1, Credits: queue2})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 2, Plan: plan(t, 30)})
	h.run()
	if err, ok := h.done[2]; !ok || err != nil {
		t.Fatalf("the next transfer: done %v, err %v", ok, err)
	}
	h.idle()
}
