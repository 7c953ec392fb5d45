// Gathering a chunk: the sender core's copy commands become device copies
// into send slots, and their completions events for the core.

package proxy

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/staging"
)

// gatherer enqueues the gathers the sender core asks for. Mapped chunks
// (KV transfers) are mapped and enqueued by goroutines of their own, off
// the loop: mapping a chunk of a layout that keeps heads apart walks
// thousands of rows.
type gatherer struct {
	pool    *staging.Pool // the send pool: the core's slots, one for one
	copiers *copierSet
	mbox    *mailbox      // the core hears EvCopyDone here
	nanos   *atomic.Int64 // device copy time of gathers (metrics)
	mapq    chan staging.CopyCmd
}

// slot is the pages of a slot the sender core handed to a chunk.
func (g *gatherer) slot(i staging.SendSlot) device.Pinned { return g.pool.Slot(int(i)) }

// start enqueues the copy c (the loop goroutine only).
func (g *gatherer) start(c staging.CopyCmd) {
	if c.C.Mapped() {
		g.mapq <- c // never blocks: it holds a slot for each copy in flight
		return
	}
	g.segs(c, c.C.Src)
}

// segs enqueues the copy of chunk c's sources segs into its send slot.
func (g *gatherer) segs(c staging.CopyCmd, segs []device.Seg) {
	g.with(c, func(buf device.Pinned, done func(error)) error { return g.copiers.take().Gather(buf, segs, done) })
}

// with enqueues the copy of c into its slot by enqueue (segments or runs);
// the core hears EvCopyDone when it completed or failed.
func (g *gatherer) with(c staging.CopyCmd, enqueue func(buf device.Pinned, done func(error)) error) {
	buf := g.slot(c.Slot).Slice(0, int(c.C.Len))
	t0 := time.Now()
	err := enqueue(buf, func(err error) {
		g.nanos.Add(int64(time.Since(t0)))
		g.mbox.post(staging.Event{Kind: staging.EvCopyDone, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Err: err, Now: time.Now()})
	})
	if err != nil {
		g.mbox.post(staging.Event{Kind: staging.EvCopyDone, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Err: err, Now: time.Now()})
	}
}

// startMappers starts the goroutines that map and enqueue mapped chunks.
// The loop owns them: the returned func, run when the loop ends (after
// its drain), lets them finish what was queued and waits.
func (g *gatherer) startMappers() (stop func()) {
	n := min(4, max(1, runtime.GOMAXPROCS(0)/2))
	g.mapq = make(chan staging.CopyCmd, g.pool.Cap())
	var wg sync.WaitGroup
	wg.Add(n)
	for range n {
		go func() {
			defer wg.Done()
			var segs []device.Seg
			var runs []device.Run
			for c := range g.mapq {
				if c.C.HasRuns() {
					runs = c.C.SourceRuns(runs[:0])
					g.with(c, func(buf device.Pinned, done func(error)) error { return g.copiers.take().GatherRuns(buf, runs, done) })
					continue
				}
				segs = c.C.Sources(segs[:0])
				g.segs(c, segs)
			}
		}()
	}
	return func() {
		close(g.mapq)
		wg.Wait()
	}
}
