package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// benchPair is one transfer's buffers: the local cache, the peer's, and
// the transfer between them.
type benchPair struct {
	src, dst *kvsim.Cache
	ms       []kvsim.Move
	t        client.Transfer
}

// benchPairs registers o.inflight pairs of buffers (one per transfer in
// flight) with the two sidecars; close unregisters and frees them.
func benchPairs(ctx context.Context, o benchOpts, lc, rc *client.Client, tag string) (ps []*benchPair, release func(), err error) {
	var undo []func()
	release = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			release()
		}
	}()
	seed := uint64(time.Now().UnixNano())
	for i := 0; i < o.inflight; i++ {
		name := tag
		if i > 0 {
			name = fmt.Sprintf("%s-%d", tag, i)
		}
		L, err := newCache(o.ldev, name+"-local", 1, o.size, 4096)
		if err != nil {
			return nil, nil, err
		}
		undo = append(undo, func() { L.Close() })
		R, err := newCache(o.rdev, name+"-remote", 1, o.size, 4096)
		if err != nil {
			return nil, nil, err
		}
		undo = append(undo, func() { R.Close() })
		if err := L.Register(ctx, lc, wire.AccessLocalRead|wire.AccessLocalWrite); err != nil {
			return nil, nil, err
		}
		undo = append(undo, func() { _ = L.Unregister(context.Background(), lc) })
		if err := R.Register(ctx, rc, wire.AccessRemoteRead|wire.AccessRemoteWrite); err != nil {
			return nil, nil, err
		}
		undo = append(undo, func() { _ = R.Unregister(context.Background(), rc) })
		p := &benchPair{src: L, dst: R}
		if o.dir == wire.Pull {
			p.src, p.dst = R, L
		}
		if err := p.src.Fill(seed); err != nil {
			return nil, nil, err
		}
		if o.blocks {
			p.ms = kvsim.Blocks(p.src, o.block, 3)
		} else {
			p.ms = kvsim.Ranges(p.src, o.block)
		}
		p.t = kvsim.Transfer(o.route, o.dir, name, L, R, p.ms)
		p.t.Checksum = o.checksum
		ps = append(ps, p)
	}
	return ps, release, nil
}

func runBench(ctx context.Context, o benchOpts) (*BenchResult, error) {
	o.inflight = max(o.inflight, 1)
	lc, rc, err := benchClients(o)
	if err != nil {
		return nil, err
	}
	defer lc.Close()
	defer rc.Close()
	tag := fmt.Sprintf("bench-%d", time.Now().UnixNano()%1e6)
	pairs, closePairs, err := benchPairs(ctx, o, lc, rc, tag)
	if err != nil {
		return nil, err
	}
	defer closePairs()
	pat := "ranges"
	if o.blocks {
		pat = "blocks"
	}
	// Warm-up: one transfer at a time on every pair (the first moves of a
	// region include its imports on a same-node path), each verified.
	var warm time.Duration
	p0 := pairs[0]
	for j, p := range pairs {
		for i := 0; i < o.warmup; i++ {
			if warm, err = timedTransfer(ctx, lc, p, o.verify, true); err != nil {
				return nil, fmt.Errorf("warm-up transfer %d on pair %d: %w", i, j, err)
			}
		}
	}
	cpu0, _, _, err := eachCPU(ctx, lc, rc)
	if err != nil {
		return nil, err
	}
	self0 := selfCPU()
	if o.prof != nil {
		// The profile spans about the timed transfers: their count times
		// the last warm-up's time, divided among those in flight.
		o.prof.start(ctx, fmt.Sprintf("%s-%s", pat, config.ByteSize(o.block)), warm*time.Duration(o.iters)/time.Duration(o.inflight))
	}
	var lat []time.Duration
	var busy time.Duration
	if o.inflight == 1 && (!o.verifyEnd || o.pause > 0) {
		lat, busy, err = benchSerial(ctx, o, lc, p0)
	} else {
		lat, busy, err = benchInflight(ctx, o, lc, pairs)
	}
	if err != nil {
		return nil, err
	}
	self1 := selfCPU()
	cpu1, rss, pool, err := eachCPU(ctx, lc, rc)
	if err != nil {
		return nil, err
	}
	if o.prof != nil {
		if err := o.prof.wait(); err != nil {
			return nil, err
		}
	}
	idle, idleSelf, err := idleCPU(ctx, idleWindow, lc, rc)
	if err != nil {
		return nil, err
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) float64 { return percentileUs(lat, p) }
	moved := float64(uint64(len(lat)) * o.size)
	gb := moved / 1e9
	local, remote := cpu1[0]-cpu0[0], cpu1[1]-cpu0[1]
	return &BenchResult{Route: o.route, Dir: o.dir.String(), Pattern: pat, Size: o.size, Block: o.block, Iters: len(lat), Inflight: o.inflight,
		GBps: moved / busy.Seconds() / 1e9, P50us: pct(0.5), P90us: pct(0.9), P99us: pct(0.99),
		MaxUs: pct(1), Verified: o.verify, VerifiedAtEnd: o.verify && (o.verifyEnd || o.inflight > 1), PauseMs: float64(o.pause) / 1e6, TotalSecs: busy.Seconds(), Devices: o.ldev.String() + " -> " + o.rdev.String(),
		CPUSecPerGB: (local + remote) / gb, CPULocal: local / gb, CPURemote: remote / gb, CPUClient: (self1 - self0) / gb,
		CPUusPerXfer: (local + remote) * 1e6 / float64(max(len(lat), 1)),
		IdleCPUPct:   idle, IdleCPUSelfPct: idleSelf, MaxRSS: rss, PoolBytes: pool}, nil
}

// benchClients dials the two sidecars: the local one (the sender's engine)
// with --pieces, both polling as --spin says.
func benchClients(o benchOpts) (lc, rc *client.Client, err error) {
	var spinOpts []client.Option
	if o.spinSet {
		p := o.spin.Resolve()
		spinOpts = append(spinOpts, client.WithAdaptiveSpin(p.Base, p.Max))
	}
	opts := append([]client.Option(nil), spinOpts...)
	if o.pieces >= 0 {
		opts = append(opts, client.WithPieces(o.pieces, client.DefaultFirstPiece, client.DefaultPiece))
	}
	if lc, err = client.Dial(o.local, opts...); err != nil {
		return nil, nil, err
	}
	if rc, err = client.Dial(o.remote, spinOpts...); err != nil {
		_ = lc.Close()
		return nil, nil, err
	}
	return lc, rc, nil
}

// percentileUs is the p-th percentile (0..1, nearest rank) of sorted
// latencies, in microseconds; 0 for none.
func percentileUs(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	i = max(0, min(i, len(sorted)-1))
	return float64(sorted[i].Nanoseconds()) / 1e3
}

// idleWindow is how long bench watches the sidecars do nothing after the
// timed transfers: polling readers (staging.read_spin, the client's spin)
// must stop within their window, so any CPU they burn here is a leak.
const idleWindow = 500 * time.Millisecond

// idleCPU is the CPU both sidecars, and this process (the engine's side:
// its client's reader), used while no transfer ran for d, as percent of one
// core. The window starts after a short grace for the last answers' polls.
func idleCPU(ctx context.Context, d time.Duration, cls ...*client.Client) (sidecars, self float64, err error) {
	time.Sleep(20 * time.Millisecond)
	c0, _, _, err := sidecarsCPU(ctx, cls...)
	if err != nil {
		return 0, 0, err
	}
	s0, t0 := selfCPU(), time.Now()
	time.Sleep(d)
	c1, _, _, err := sidecarsCPU(ctx, cls...)
	if err != nil {
		return 0, 0, err
	}
	el := time.Since(t0).Seconds()
	return 100 * (c1 - c0) / el, 100 * (selfCPU() - s0) / el, nil
}

// timedTransfer moves p once and returns how long the transfer took; with
// verify, the destination is poisoned before (outside the time) and, when
// check, every byte is compared after.
func timedTransfer(ctx context.Context, lc *client.Client, p *benchPair, verify, check bool) (time.Duration, error) {
	if verify {
		if err := p.dst.Poison(0xAB); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	if _, err := lc.Do(ctx, p.t); err != nil {
		return 0, err
	}
	el := time.Since(start)
	if verify && check {
		if err := kvsim.Verify(p.src, p.dst, p.ms, 0xAB); err != nil {
			return 0, err
		}
	}
	return el, nil
}

// benchSerial times o.iters transfers one after another, each after
// o.pause idle and, with o.verify, checked (with o.verifyEnd once after the
// last); busy is the sum of their times.
func benchSerial(ctx context.Context, o benchOpts, lc *client.Client, p *benchPair) (lat []time.Duration, busy time.Duration, err error) {
	each := o.verify && !o.verifyEnd
	if o.verify && o.verifyEnd {
		if err := p.dst.Poison(0xAB); err != nil {
			return nil, 0, err
		}
	}
	bar := newBenchBar(o)
	for i := 0; i < o.iters; i++ {
		if o.pause > 0 {
			select {
			case <-time.After(o.pause):
			case <-ctx.Done():
				return nil, 0, ctx.Err()
			}
		}
		el, err := timedTransfer(ctx, lc, p, each, true)
		if err != nil {
			return nil, 0, fmt.Errorf("transfer %d: %w", i, err)
		}
		lat = append(lat, el)
		busy += el
		bar.show(len(lat), busy)
	}
	bar.end()
	if o.verify && o.verifyEnd {
		if err := kvsim.Verify(p.src, p.dst, p.ms, 0xAB); err != nil {
			return nil, 0, err
		}
	}
	return lat, busy, nil
}

// benchInflight keeps o.inflight transfers going at once (one or more),
// one per pair, until o.iters have finished; busy is the wall time from
// the first start to the last end. With o.verify every pair's destination
// is poisoned before and checked after.
func benchInflight(ctx context.Context, o benchOpts, lc *client.Client, pairs []*benchPair) (lat []time.Duration, busy time.Duration, err error) {
	if o.verify {
		for _, p := range pairs {
			if err := p.dst.Poison(0xAB); err != nil {
				return nil, 0, err
			}
		}
	}
	var (
		next  atomic.Int64
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	bar := newBenchBar(o)
	start := time.Now()
	for _, p := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(o.iters) {
				el, err := timedTransfer(ctx, lc, p, false, false)
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				lat = append(lat, el)
				bar.show(len(lat), time.Since(start))
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	busy = time.Since(start)
	bar.end()
	if first != nil {
		return nil, 0, first
	}
	if o.verify {
		for i, p := range pairs {
			if err := kvsim.Verify(p.src, p.dst, p.ms, 0xAB); err != nil {
				return nil, 0, fmt.Errorf("pair %d: %w", i, err)
			}
		}
	}
	return lat, busy, nil
}

// benchBar draws bench's progress on a terminal.
type benchBar struct {
	on    bool
	iters int
	size  uint64
}

func newBenchBar(o benchOpts) benchBar {
	return benchBar{on: o.iters >= 3 && isTerminal(os.Stderr), iters: o.iters, size: o.size}
}

func (b benchBar) show(done int, busy time.Duration) {
	if !b.on {
		return
	}
	n := done * 30 / b.iters
	fmt.Fprintf(os.Stderr, "\rbench [%s%s] %d/%d  %.3f GB/s", strings.Repeat("=", n), strings.Repeat(" ", 30-n), done, b.iters, float64(uint64(done)*b.size)/busy.Seconds()/1e9)
}

func (b benchBar) end() {
	if b.on {
		fmt.Fprintln(os.Stderr)
	}
}
