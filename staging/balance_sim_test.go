package staging

import (
	"math/rand/v2"
	"testing"
	"time"
)

// A model of one transfer's end, to check that the core's choices do what
// balance.go and tail.go mean them to: eight streams whose sockets hold up
// to sockCap bytes each and drain at uneven, jittering rates (the peer's
// readers), writers that move a chunk into their socket as room frees,
// copies of fixed duration, and the real Sender core deciding. The figure
// is the time from the first stream running dry, with others still
// holding bytes, to the last byte drained: what one transfer loses to its
// tail (docs/BENCHMARKS.md, "The one-transfer rows, traced").

const (
	simStreams = 8
	simChunk   = 4 << 20
	simSockCap = 6 << 20 // send buffer plus what the receiver's buffer holds
	simRate    = 3000    // mean bytes per microsecond per stream (24 GB/s on eight)
	simCopyUS  = 170     // one chunk's gather, microseconds
	simStepUS  = 5
)

// simSeg is a chunk's bytes in a socket, not yet drained.
type simSeg struct {
	cmd  SendCmd
	left int
	full bool // every byte of the chunk is in the socket (the write returned)
}

type simStream struct {
	rate  float64 // bytes per microsecond now
	base  float64 // its mean rate
	queue []SendCmd
	moved int // bytes of queue[0] in the socket
	sock  []simSeg
	held  int // bytes in the socket
	carry float64
}

// simTail runs one transfer of total bytes and returns the tail (first
// stream dry to last byte drained) and the whole transfer's time, in
// microseconds.
func simTail(t *testing.T, total uint64, depth int, balance bool, tail uint32, seed uint64) (tailUS, allUS int) {
	r := rand.New(rand.NewPCG(seed, 7))
	s := NewSenderDepth(32, depth)
	streams := make([]*simStream, simStreams)
	for i := range streams {
		base := simRate * (0.8 + 0.4*r.Float64())
		streams[i] = &simStream{rate: base, base: base}
	}
	if balance {
		s.SetSocketProbe(func(_ uint64, q []uint64) {
			for i, st := range streams {
				q[i] = uint64(st.held)
			}
		})
	}
	s.SetTailChunk(tail)
	type copying struct {
		cmd CopyCmd
		at  int
	}
	var copies []copying
	now := 0
	step := func(ev Event) {
		ev.Now = time.Unix(0, int64(now)*1000)
		rd := s.Step(ev)
		for _, c := range rd.Copies {
			copies = append(copies, copying{c, now + simCopyUS})
		}
		for _, c := range rd.Sends {
			streams[c.Stream].queue = append(streams[c.Stream].queue, c)
		}
		if len(rd.Done) > 0 && rd.Done[0].Err != nil {
			t.Fatalf("transfer failed: %v", rd.Done[0].Err)
		}
	}
	step(Event{Kind: EvSessionUp, Session: 1, N: simStreams, Credits: 32})
	p, err := NewPlan([]PlanOp{{Src: 1 << 40, Len: total}}, simChunk)
	if err != nil {
		t.Fatal(err)
	}
	step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: p})
	firstDry := -1
	for now = 0; s.Active() > 0; now += simStepUS {
		if now > 10_000_000 {
			t.Fatal("the model ran 10 s without finishing")
		}
		if now%100 == 0 {
			for _, st := range streams {
				st.rate = st.base * (0.7 + 0.6*r.Float64())
			}
		}
		keep := copies[:0]
		var due []CopyCmd
		for _, c := range copies {
			if c.at <= now {
				due = append(due, c.cmd)
			} else {
				keep = append(keep, c)
			}
		}
		copies = keep
		for _, c := range due {
			step(Event{Kind: EvCopyDone, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot})
		}
		for i, st := range streams {
			// The writer: the chunk at the head of its queue into the socket.
			for len(st.queue) > 0 && st.held < simSockCap {
				c := st.queue[0]
				if st.moved == 0 {
					st.sock = append(st.sock, simSeg{cmd: c})
				}
				seg := &st.sock[len(st.sock)-1]
				n := min(simSockCap-st.held, int(c.C.Len)-st.moved)
				st.moved += n
				st.held += n
				seg.left += n
				if st.moved < int(c.C.Len) {
					break
				}
				seg.full = true
				st.queue, st.moved = st.queue[1:], 0
				step(Event{Kind: EvWritten, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Stream: i})
			}
			// The peer drains it.
			st.carry += st.rate * simStepUS
			for len(st.sock) > 0 && st.carry >= 1 {
				seg := &st.sock[0]
				n := min(int(st.carry), seg.left)
				seg.left -= n
				st.held -= n
				st.carry -= float64(n)
				if seg.left > 0 || !seg.full {
					break
				}
				c := seg.cmd
				st.sock = st.sock[1:]
				step(Event{Kind: EvAck, Session: 1, Transfer: c.Transfer, Chunks: []uint32{c.Chunk}})
			}
			if len(st.sock) == 0 {
				st.carry = 0 // an empty socket banks no drain
			}
		}
		if firstDry < 0 && allHanded(s) {
			for _, st := range streams {
				if st.held == 0 && len(st.queue) == 0 {
					firstDry = now
					break
				}
			}
		}
	}
	if firstDry < 0 {
		firstDry = now
	}
	return now - firstDry, now
}

// allHanded reports whether every chunk of transfer 1 was started (the
// transfer is in its last round).
func allHanded(s *Sender) bool {
	x := s.xfers[1]
	return x == nil || (x.next >= x.plan.Len() && len(x.redo) == 0)
}

// TestModelTail: in the model, balancing on socket bytes and cutting the
// tail finer end a 1 GiB transfer's streams closer together than the rule
// before them, over several seeds, and the transfer is not slower.
func TestModelTail(t *testing.T) {
	if testing.Short() {
		t.Skip("the model moves 1 GiB several times")
	}
	variants := []struct {
		name    string
		balance bool
		tail    uint32
	}{
		{"chunks (before)", false, 0},
		{"balance_sockets", true, 0},
		{"tail_chunk 256KiB", false, 256 << 10},
		{"both", true, 256 << 10},
	}
	const seeds = 5
	for _, depth := range []int{1, 3} { // stream_depth auto: writev, splice
		tails := make([]int, len(variants))
		alls := make([]int, len(variants))
		for i, v := range variants {
			for seed := range uint64(seeds) {
				tl, all := simTail(t, 1<<30, depth, v.balance, v.tail, seed+1)
				tails[i] += tl
				alls[i] += all
			}
			t.Logf("depth %d, %-18s tail %5d us, transfer %6d us (mean of %d seeds)", depth, v.name, tails[i]/seeds, alls[i]/seeds, seeds)
		}
		if tails[3] >= tails[0] || alls[3] > alls[0] {
			t.Fatalf("depth %d, both: tail %d us, transfer %d us; before: %d us, %d us", depth, tails[3]/seeds, alls[3]/seeds, tails[0]/seeds, alls[0]/seeds)
		}
	}
}
