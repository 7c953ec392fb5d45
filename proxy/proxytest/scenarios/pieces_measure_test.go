package scenarios_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// TestMeasurePiecesFirstChunk measures, on this machine's CPU device, the
// time from the engine's call to the first chunk on the wire (the
// sender's link counts its first written chunk) for a push of 65,536 x
// 16 KiB blocks (STAGE_MEASURE_OPS of them), sent in one Submit and in
// pieces, interleaved. Run by hand (it moves 2 x rounds GiB):
//
//	STAGE_MEASURE_PIECES=9 nice go test -count=1 -run TestMeasurePiecesFirstChunk -v ./proxy/proxytest/scenarios/
func TestMeasurePiecesFirstChunk(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("STAGE_MEASURE_PIECES"))
	blocks, err := strconv.Atoi(os.Getenv("STAGE_MEASURE_OPS"))
	if err != nil {
		blocks = 65536
	}
	if rounds <= 0 {
		t.Skip("a measurement: set STAGE_MEASURE_PIECES=rounds")
	}
	o := e2eOpts()
	o.SlotSize, o.Slots, o.Stripes = 4<<20, 32, 4
	pre, dec := proxytest.Pair(t, o)
	S, D := caches(t, pre, dec, 1, uint64(blocks)*16<<10)
	ms := kvsim.Blocks(S, 16<<10, 9)
	tr := kvsim.Transfer(route, wire.Push, "measure", S, D, ms)
	t0 := time.Now()
	enc := wire.AppendFrame(nil, &wire.Submit{Req: 1, Route: tr.Route, Dir: tr.Dir, LocalNames: tr.LocalNames, RemoteNames: tr.RemoteNames, Ops: tr.Ops}, false, 0)
	t.Logf("%d ops; one Submit frame is %d bytes, encoded in %v", len(tr.Ops), len(enc), time.Since(t0))
	one := pre.Dial(t, client.WithPieces(0, 1, 1))
	pieces := pre.Dial(t, client.WithPieces(1, client.DefaultFirstPiece, client.DefaultPiece))
	firstChunk := func(cl *client.Client) (first, whole time.Duration) {
		before := chunksOut(pre)
		got := make(chan time.Duration, 1)
		start := time.Now()
		go func() {
			for chunksOut(pre) == before {
				time.Sleep(20 * time.Microsecond)
			}
			got <- time.Since(start)
		}()
		if _, err := cl.Do(context.Background(), tr); err != nil {
			t.Fatal(err)
		}
		return <-got, time.Since(start)
	}
	firstChunk(pieces) // warm both paths (and ask QueryFeatures once)
	firstChunk(one)
	var a, b, wa, wb []time.Duration
	for range rounds {
		f, w := firstChunk(one)
		a, wa = append(a, f), append(wa, w)
		f, w = firstChunk(pieces)
		b, wb = append(b, f), append(wb, w)
	}
	med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	t.Logf("first chunk on the wire, median of %d: one Submit %v %v, pieces (%d, %d per piece) %v %v",
		rounds, med(a), a, client.DefaultFirstPiece, client.DefaultPiece, med(b), b)
	t.Logf("whole transfer, median: one Submit %v, pieces %v", med(wa), med(wb))
}

// chunksOut is the chunks sc wrote on its data streams so far.
func chunksOut(sc *proxytest.Sidecar) (n uint64) {
	for _, l := range sc.Snapshot().Links {
		n += l.ChunksOut
	}
	return n
}
