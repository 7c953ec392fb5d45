package staging

import (
	"errors"
	"testing"
	"time"
)

// step runs one event on r and returns its output.
func rstep(r *Receiver, ev RecvEvent) *RecvReady {
	var out RecvReady
	r.Step(ev, &out)
	return &out
}

// The answer a drained chunk gets (PROTOCOL 8.7): a Credit, unless it took
// none (inline) or is a second copy of a chunk that landed.
func TestReceiverDrainedChunkCredit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		setup   []RecvEvent
		chunk   RecvEvent
		credits int
		nack    bool
	}{
		{"unknown transfer", nil, RecvEvent{Transfer: 4, Chunk: 0, Count: 1}, 1, false},
		{"unknown, inline", nil, RecvEvent{Transfer: 4, Chunk: 0, Count: 1, Inline: true}, 0, false},
		{"refused push", []RecvEvent{{Kind: RxRefused, Transfer: 4}}, RecvEvent{Transfer: 4, Chunk: 0, Count: 1}, 1, false},
		{"complete push: a second copy", []RecvEvent{
			{Kind: RxOpen, Transfer: 4, Total: 8}, {Kind: RxChunk, Transfer: 4, Count: 1},
			{Kind: RxLanded, Transfer: 4, Bytes: 8}, {Kind: RxRelease, Transfer: 4},
		}, RecvEvent{Transfer: 4, Chunk: 0, Count: 1}, 0, false},
		{"failed push, chunk never landed", []RecvEvent{
			{Kind: RxOpen, Transfer: 4, Total: 16}, {Kind: RxFail, Transfer: 4, Err: errors.New("x")},
		}, RecvEvent{Transfer: 4, Chunk: 1, Count: 2}, 1, false},
		{"segments out of range", []RecvEvent{{Kind: RxOpen, Transfer: 4, Total: 8}},
			RecvEvent{Transfer: 4, Chunk: 0, Count: 1, Err: errors.New("out of range")}, 1, true},
		{"index past the count", []RecvEvent{{Kind: RxOpen, Transfer: 4, Total: 8}},
			RecvEvent{Transfer: 4, Chunk: 1, Count: 1}, 1, true},
		{"inline chunk of two", []RecvEvent{{Kind: RxOpen, Transfer: 4, Total: 8, Inline: true}},
			RecvEvent{Transfer: 4, Chunk: 0, Count: 2, Inline: true}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReceiver(8)
			for _, ev := range tc.setup {
				rstep(r, ev)
			}
			tc.chunk.Kind = RxChunk
			out := rstep(r, tc.chunk)
			if out.Hold {
				t.Fatal("the chunk was held; want it drained")
			}
			if out.Credits != tc.credits || (len(out.Nacks) > 0) != tc.nack {
				t.Fatalf("got %d credits, Nacks %v; want %d credits, a Nack %v", out.Credits, out.Nacks, tc.credits, tc.nack)
			}
			if tc.nack && (out.Err == nil || !errors.Is(out.Err, out.Nacks[0].Err)) {
				t.Fatalf("refusal %v not reported with its Nack %v", out.Err, out.Nacks[0].Err)
			}
		})
	}
}

// Rule errors carry their kind for the proxy's wire codes and their own
// message for the peer.
func TestReceiverErrorKinds(t *testing.T) {
	r := NewReceiver(1)
	rstep(r, RecvEvent{Kind: RxOpen, Transfer: 2, Total: 8})
	for _, tc := range []struct {
		ev   RecvEvent
		kind error
		msg  string
	}{
		{RecvEvent{Kind: RxOpen, Transfer: 2, Total: 8}, ErrExists, "transfer 2 already in progress or finished"},
		{RecvEvent{Kind: RxOpen, Transfer: 4, Total: 8}, ErrBusy, "limits.max_transfers_per_peer (1) reached"},
		{RecvEvent{Kind: RxChunk, Transfer: 2, Count: 9}, ErrMalformed, "chunk count 9 is impossible for 8 B"},
		{RecvEvent{Kind: RxDirect, Transfer: 2, Bytes: 8}, ErrFinished, "transfer already finished"},
	} {
		out := rstep(r, tc.ev)
		if !errors.Is(out.Err, tc.kind) || out.Err.Error() != tc.msg {
			t.Errorf("event %+v: got %v, want %q of kind %v", tc.ev, out.Err, tc.msg, tc.kind)
		}
	}
	r = NewReceiver(1)
	now := time.Unix(100, 0)
	rstep(r, RecvEvent{Kind: RxOpen, Transfer: 2, Total: 8, Timeout: time.Second, Now: now})
	out := rstep(r, RecvEvent{Kind: RxTick, Now: now.Add(2 * time.Second)})
	if len(out.Nacks) != 1 || !errors.Is(out.Nacks[0].Err, ErrTimeout) {
		t.Fatalf("stalled transfer: Nacks %v, want one of kind ErrTimeout", out.Nacks)
	}
}

// Tombstones are bounded per session, and the landed bitmaps of failed
// transfers within their own budget; a bitmap goes with its tombstone.
func TestReceiverTombstonesBounded(t *testing.T) {
	g := newTombstones(3, 4)
	for id := uint64(1); id <= 3; id++ {
		g.bury(id, false)
		g.keepBits(id, []uint64{1, 0}) // chunk 0 landed; the third is over the budget
	}
	for _, tc := range []struct {
		id   uint64
		idx  uint32
		want bool
	}{{1, 0, true}, {1, 1, false}, {2, 0, true}, {3, 0, false}, {1, 1 << 30, false}} {
		if got := g.landed(tc.id, tc.idx); got != tc.want {
			t.Errorf("transfer %d chunk %d: landed %v, want %v", tc.id, tc.idx, got, tc.want)
		}
	}
	g.bury(4, true)
	if g.has(1) || g.words != 2 || !g.has(4) || !g.landed(4, 7) {
		t.Fatalf("after eviction: has(1) %v, %d words, has(4) %v; want false, 2, true", g.has(1), g.words, g.has(4))
	}
	g.bury(5, true)
	g.bury(6, true)
	if g.words != 0 || len(g.bits) != 0 {
		t.Fatalf("%d words in %d bitmaps outlived their tombstones", g.words, len(g.bits))
	}
	r := NewReceiver(maxGone + 1)
	for id := uint64(0); id < 3*maxGone; id++ {
		rstep(r, RecvEvent{Kind: RxRefused, Transfer: id})
	}
	if len(r.gone.complete) != maxGone || r.State(3*maxGone-1) != RecvGone || r.State(0) != RecvUnknown {
		t.Fatalf("kept %d tombstones; want %d, the newest kept", len(r.gone.complete), maxGone)
	}
}

// FuzzReceiver steps random events and checks what must hold whatever a
// peer sends: a transfer completes once, is released once, after it
// completed and with no chunk held; a chunk is acked at most once; the
// core's holds are the chunks it handed out and were not let go.
func FuzzReceiver(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	f.Add([]byte{0, 0x12, 0x22, 0x14, 0x16, 0x09, 0x2b, 0x0c})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewReceiver(3)
		now := time.Unix(0, 0)
		done, released := map[uint64]bool{}, map[uint64]bool{}
		acked := map[Answer]bool{}
		var held []Answer // chunks the core handed a hold, in order
		for i, c := range b {
			id := uint64(c>>4) % 4
			now = now.Add(100 * time.Millisecond)
			ev := RecvEvent{Transfer: id, Chunk: uint32(c>>6) % 3, Count: 2, Bytes: 8, Total: 16, Timeout: time.Second, Now: now,
				Inline: c&0x8 != 0 && c&0x7 == 0, Pull: id == 3}
			k := -1 // the held chunk the event is about
			switch c & 0x7 {
			case 0:
				ev.Kind = RxOpen
			case 1, 2:
				ev.Kind = RxChunk
			case 5:
				ev.Kind, ev.Err, ev.TellPeer = RxFail, errors.New("failed"), true
			case 6:
				ev.Kind = RxTick
			default:
				if len(held) == 0 {
					continue
				}
				k = int(c>>3) % len(held)
				ev.Transfer, ev.Chunk = held[k].Transfer, held[k].Chunk
				ev.Kind = map[byte]RecvEventKind{3: RxLanded, 4: RxRelease, 7: RxDamaged}[c&0x7]
			}
			out := rstep(r, ev)
			if ev.Kind == RxOpen && out.Err == nil { // a new transfer (our failed pull's id, reused here only)
				delete(done, id)
				delete(released, id)
				for a := range acked {
					if a.Transfer == id {
						delete(acked, a)
					}
				}
			}
			if out.Hold {
				held = append(held, Answer{ev.Transfer, ev.Chunk})
			}
			if ev.Kind == RxRelease {
				held = append(held[:k], held[k+1:]...)
			}
			for _, a := range out.Acks {
				if acked[a] {
					t.Fatalf("step %d: chunk %d of %d acked twice", i, a.Chunk, a.Transfer)
				}
				acked[a] = true
			}
			for _, d := range out.Done {
				if done[d.Transfer] {
					t.Fatalf("step %d: transfer %d completed twice", i, d.Transfer)
				}
				done[d.Transfer] = true
			}
			for _, id := range out.Released {
				n := 0
				for _, h := range held {
					if h.Transfer == id {
						n++
					}
				}
				if released[id] || !done[id] || n != 0 {
					t.Fatalf("step %d: transfer %d released (before: %v) with done %v, %d chunks held", i, id, released[id], done[id], n)
				}
				released[id] = true
			}
			for id, x := range r.xfers {
				n := 0
				for _, h := range held {
					if h.Transfer == id {
						n++
					}
				}
				if x.holds != n {
					t.Fatalf("step %d: transfer %d has %d holds, want %d", i, id, x.holds, n)
				}
			}
		}
	})
}

// A small push, one after another, steps through the core without
// allocating once warm (the latency path: the output's arrays and the
// retired transfer records are reused).
func TestReceiverInlinePushAllocs(t *testing.T) {
	r := NewReceiver(8)
	var out RecvReady
	id := uint64(1)
	push := func() {
		for _, ev := range []RecvEvent{
			{Kind: RxOpen, Transfer: id, Total: 4096, Inline: true},
			{Kind: RxChunk, Transfer: id, Count: 1, Inline: true},
			{Kind: RxLanded, Transfer: id, Bytes: 4096},
			{Kind: RxRelease, Transfer: id},
		} {
			out.Reset()
			r.Step(ev, &out)
			if out.Err != nil {
				t.Fatal(out.Err)
			}
		}
		if len(out.Released) != 1 {
			t.Fatalf("push %d not released", id)
		}
		id += 2
	}
	for range 2 * maxGone { // the tombstones full
		push()
	}
	if n := testing.AllocsPerRun(1000, push); n != 0 {
		t.Errorf("%v allocations per small push, want 0", n)
	}
}
