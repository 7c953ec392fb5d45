package staging

import (
	"testing"
	"time"
)

func TestShapeClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name                     string
		writes                   [][2]int // stream, ms
		done                     int
		streams                  int
		ramp, tail, drain, total time.Duration
	}{
		{"none written", nil, 5, 0, 0, 0, 0, 5 * time.Millisecond},
		{"one stream", [][2]int{{0, 2}, {0, 4}}, 6, 1, 2 * time.Millisecond, 0, 2 * time.Millisecond, 6 * time.Millisecond},
		{"three streams, one ends early", [][2]int{{0, 1}, {1, 2}, {2, 2}, {1, 7}, {2, 9}}, 12, 3,
			1 * time.Millisecond, 8 * time.Millisecond, 3 * time.Millisecond, 12 * time.Millisecond},
		{"a stream number out of range is not one", [][2]int{{-1, 1}, {1 << 20, 3}, {0, 4}}, 5, 1,
			1 * time.Millisecond, 0, 1 * time.Millisecond, 5 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var k shapeClock
			k.Submitted = t0
			for _, w := range tc.writes {
				k.written(w[0], at(w[1]))
			}
			h := k.done(at(tc.done))
			if h.Streams != tc.streams || h.Ramp() != tc.ramp || h.Tail() != tc.tail || h.Drain() != tc.drain || h.Total() != tc.total {
				t.Fatalf("streams %d ramp %v tail %v drain %v total %v; want %d %v %v %v %v",
					h.Streams, h.Ramp(), h.Tail(), h.Drain(), h.Total(), tc.streams, tc.ramp, tc.tail, tc.drain, tc.total)
			}
		})
	}
}

// A push through the core carries its shape in its completion, from the
// events' times.
func TestSenderShape(t *testing.T) {
	h := newHarness(t, 8)
	var got *Shape
	h.onReady = func(r *Ready) {
		for _, d := range r.Done {
			s := d.Shape
			got = &s
		}
	}
	t0 := h.now
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 2, Credits: 8})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 4)})
	h.now = t0.Add(time.Millisecond)
	h.finishCopies(nil)
	// Stream by stream, a millisecond apart: the last stream to finish
	// writes 2 ms after the first.
	sends := h.sends
	h.sends = nil
	for i, c := range sends {
		h.now = t0.Add(time.Duration(2+i) * time.Millisecond)
		h.written = append(h.written, c)
		h.step(Event{Kind: EvWritten, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream})
	}
	if len(sends) != 4 {
		t.Fatalf("%d sends, want 4 at once", len(sends))
	}
	h.now = t0.Add(10 * time.Millisecond)
	h.ackAll()
	if got == nil {
		t.Fatal("no completion")
	}
	if got.Submitted != t0 || got.FirstGathered != t0.Add(time.Millisecond) || got.FirstWritten != t0.Add(2*time.Millisecond) ||
		got.LastWritten != t0.Add(5*time.Millisecond) || got.Done != t0.Add(10*time.Millisecond) || got.Streams != 2 {
		t.Fatalf("shape %+v", *got)
	}
	// Each stream took two of the four: the first to finish wrote its last
	// at 4 ms (chunks alternate), the tail is 1 ms.
	if got.Gather() != time.Millisecond || got.Tail() != time.Millisecond || got.Drain() != 5*time.Millisecond || got.Ramp() != 2*time.Millisecond {
		t.Fatalf("gather %v ramp %v tail %v drain %v; want 1ms 2ms 1ms 5ms", got.Gather(), got.Ramp(), got.Tail(), got.Drain())
	}
}
