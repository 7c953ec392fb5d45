package staging

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/stage-kv/stage/device"
)

// TestGrowingPlan: a plan whose ops come in pieces covers only the chunks
// its ops reach, cuts them as a whole plan would, and refuses ops past
// its total.
func TestGrowingPlan(t *testing.T) {
	// 40 bytes in chunks of 8: five chunks; ops of 3 bytes each, scattered.
	ops := make([]PlanOp, 0, 14)
	for i := range 13 {
		ops = append(ops, PlanOp{Src: device.Addr(1000 + 10*i), DstRegion: uint32(i % 2), DstOff: 100 * uint64(i), Len: 3})
	}
	ops = append(ops, PlanOp{Src: 5000, DstOff: 7000, Len: 1})
	whole, err := MakePlan(ops, 8)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		pieces [][]PlanOp
		ready  []int // Ready after each piece
	}{
		{"one piece", [][]PlanOp{ops}, []int{5}},
		{"op by op", split(ops, 1), []int{0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 4, 4, 4, 5}},
		{"pieces of 5", split(ops, 5), []int{1, 3, 5}},
		{"empty first piece", append([][]PlanOp{nil}, ops), []int{0, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewGrowingPlan(40, 8, tc.pieces[0])
			if err != nil {
				t.Fatal(err)
			}
			if p.Len() != 5 {
				t.Fatalf("Len %d, want 5", p.Len())
			}
			for i, piece := range tc.pieces {
				if i > 0 {
					if err := p.Grow(piece); err != nil {
						t.Fatalf("Grow piece %d: %v", i, err)
					}
				}
				if got := p.Ready(); got != tc.ready[i] {
					t.Fatalf("after piece %d: Ready %d, want %d", i, got, tc.ready[i])
				}
				// Cut what is ready now, as the core would.
				for c := 0; c < p.Ready(); c++ {
					p.Chunk(c)
				}
			}
			if !p.Complete() {
				t.Fatal("not complete after every piece")
			}
			for c := range p.Len() {
				got, want := p.Chunk(c), whole.Chunk(c)
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("chunk %d: got %+v, want %+v", c, *got, *want)
				}
			}
		})
	}
}

func TestGrowingPlanRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first []PlanOp
		more  []PlanOp
		msg   string
	}{
		{"past total at once", []PlanOp{{Len: 41}}, nil, "past the 40 bytes"},
		{"past total later", []PlanOp{{Len: 39}}, []PlanOp{{Len: 1}, {Len: 1}}, "past the 40 bytes"},
		{"huge op", []PlanOp{{Len: 1}}, []PlanOp{{Len: 1<<64 - 1}}, "past the 40 bytes"},
		{"empty op", []PlanOp{{Len: 1}}, []PlanOp{{Len: 0}}, "length 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewGrowingPlan(40, 8, tc.first)
			if err == nil {
				before := p.Ready()
				err = p.Grow(tc.more)
				if p.Ready() != before {
					t.Fatalf("a refused piece changed Ready from %d to %d", before, p.Ready())
				}
			}
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want an error naming %q", err, tc.msg)
			}
		})
	}
	if _, err := NewGrowingPlan(0, 8, nil); err == nil {
		t.Fatal("a growing plan of 0 bytes was made")
	}
}

// growing is a harness whose session 1 is up and whose transfer 7, 20
// bytes in chunks of 8, has only first of its ops so far.
func growing(t *testing.T, first []PlanOp) *harness {
	t.Helper()
	h := newHarness(t, 8)
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 2, Credits: 8})
	p, err := NewGrowingPlan(20, 8, first)
	if err != nil {
		t.Fatal(err)
	}
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 7, Plan: p})
	return h
}

// TestSenderGrowingPlan: the core starts a growing transfer's chunks as
// their ops arrive, completes it once the rest came and every chunk is
// acked, and fails it (freeing everything) when the rest will not come.
func TestSenderGrowingPlan(t *testing.T) {
	ops := []PlanOp{{Src: 4096, Len: 8}, {Src: 8192, Len: 8}, {Src: 12288, Len: 4}}
	t.Run("completes", func(t *testing.T) {
		h := growing(t, ops[:1])
		if len(h.copies) != 1 || h.copies[0].Chunk != 0 {
			t.Fatalf("copies %+v after the first piece, want chunk 0 only", h.copies)
		}
		h.run()
		if _, ok := h.done[7]; ok {
			t.Fatal("done before the rest of its ops came")
		}
		h.step(Event{Kind: EvGrow, Transfer: 7, Ops: ops[1:]})
		h.run()
		if err, ok := h.done[7]; !ok || err != nil {
			t.Fatalf("got done=%v err=%v, want success", ok, err)
		}
		h.idle()
	})
	for _, tc := range []struct {
		name string
		ev   Event
		want string
	}{
		{"rest never came", Event{Kind: EvGrow, Transfer: 7, Err: errors.New("the rest did not come")}, "did not come"},
		{"past total", Event{Kind: EvGrow, Transfer: 7, Ops: []PlanOp{{Len: 20}}}, "past the 20 bytes"},
		{"cancelled", Event{Kind: EvCancel, Transfer: 7}, "cancelled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := growing(t, ops[:1])
			h.step(tc.ev)
			h.run()
			if err := h.done[7]; err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a failure naming %q", err, tc.want)
			}
			// A piece after the end changes nothing.
			h.step(Event{Kind: EvGrow, Transfer: 7, Ops: ops[1:]})
			h.run()
			h.idle()
		})
	}
}

func split(ops []PlanOp, n int) (out [][]PlanOp) {
	for len(ops) > 0 {
		k := min(n, len(ops))
		out = append(out, ops[:k])
		ops = ops[k:]
	}
	return out
}
