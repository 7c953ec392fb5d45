package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// kvAcceptRows measures how long the sidecar takes to accept a large
// SubmitKV (kvAccept), prints it, and returns it as rows (their GBps
// field holds microseconds).
func kvAcceptRows(ctx context.Context, w io.Writer, o kvBenchOpts) ([]kvRow, error) {
	const acceptBlocks = 65536
	big, small, inside, err := kvAccept(ctx, o, acceptBlocks)
	if err != nil {
		return nil, fmt.Errorf("accept time: %w", err)
	}
	fmt.Fprintf(w, "  accept a %d-block request: %v inside the sidecar (decoded SubmitKV to transfer handed to the core, mean); %v from SubmitKV sent to Submitted read (a 1-block request: %v)\n",
		acceptBlocks, inside.Round(time.Microsecond), big.Round(time.Microsecond), small.Round(time.Microsecond))
	return []kvRow{{What: fmt.Sprintf("accept %d blocks inside the sidecar (us)", acceptBlocks), GBps: float64(inside.Microseconds())},
		{What: fmt.Sprintf("accept %d blocks, engine round trip (us)", acceptBlocks), GBps: float64(big.Microseconds())},
		{What: "accept 1 block, engine round trip (us)", GBps: float64(small.Microseconds())}}, nil
}

// kvAccept measures how long the local sidecar takes to accept a KV
// request of blocks blocks, from SubmitKV sent to Submitted read (the
// sidecar has then checked both tables, built its side and plan, and
// handed the transfer to its sender core: its first chunk can move),
// beside the same for a one-block request: their difference is the cost
// of the block table. Median of iters, after one of each to warm up.
func kvAccept(ctx context.Context, o kvBenchOpts, blocks uint32) (big, small, inside time.Duration, err error) {
	lc, err := client.Dial(o.local)
	if err != nil {
		return 0, 0, 0, err
	}
	defer lc.Close()
	rc, err := client.Dial(o.remote)
	if err != nil {
		return 0, 0, 0, err
	}
	defer rc.Close()
	// Tiny rows keep 2x blocks blocks in a few tens of MiB.
	p := kvlayout.Params{DType: kvlayout.F16, Blocks: 2 * blocks, BlockSize: 16, Heads: 1, HeadHi: 1, HeadSize: 8}
	tag := fmt.Sprintf("kvaccept-%d", time.Now().UnixNano()%1e6)
	var caches []*kvsim.KV
	defer func() {
		for _, k := range caches {
			_ = k.Close()
		}
	}()
	for _, side := range []struct {
		cl   *client.Client
		dev  engineDevice
		name string
	}{{lc, o.ldev, "src"}, {rc, o.rdev, "dst"}} {
		// On each side's own device: a cuda sidecar refuses regions of another GPU.
		k, err := newKVOn(side.dev, tag+"-"+side.name, "vllm-flash", p, 1)
		if err != nil {
			return 0, 0, 0, err
		}
		caches = append(caches, k)
		if err := k.Register(ctx, side.cl, wire.AccessAll); err != nil {
			return 0, 0, 0, err
		}
		defer func(cl *client.Client, k *kvsim.KV) {
			_ = cl.Unregister(context.Background(), k.Region(0, 0))
		}(side.cl, k)
	}
	r := rand.New(rand.NewPCG(1, 2))
	measure := func(n uint32) (time.Duration, error) {
		m := kvsim.KVMove{Layers: []int{0}, SrcTable: randTable(r, int(2*blocks), int(n)),
			DstTable: randTable(r, int(2*blocks), int(n)), Tokens: n * 16}
		st0, err := lc.Stats(ctx)
		if err != nil {
			return 0, err
		}
		defer func() {
			if st1, err := lc.Stats(ctx); err == nil && st1.KVAccepts > st0.KVAccepts {
				inside = time.Duration((st1.KVAcceptNanos - st0.KVAcceptNanos) / (st1.KVAccepts - st0.KVAccepts))
			}
		}()
		return submitTime(ctx, lc, o, m.Submit(o.route, tag, wire.Push, caches[0], caches[1]), n > 1)
	}
	if small, err = measure(1); err != nil {
		return 0, 0, 0, err
	}
	big, err = measure(blocks) // last: inside is its mean
	return big, small, inside, err
}

// submitTime submits s again and again, each waited for, and returns the
// median time from SubmitKV sent to Submitted read: over 1 + max(o.iters,
// 5) submits with the first dropped, or, where o has a profile and profile
// is set, over 3 s of submits under it (long enough for a profile that
// shows where the time goes).
func submitTime(ctx context.Context, lc *client.Client, o kvBenchOpts, s wire.SubmitKV, profile bool) (time.Duration, error) {
	iters := 1 + max(o.iters, 5)
	more, skip := func(i int) bool { return i < iters }, 1
	if o.prof != nil && profile {
		const span = 3 * time.Second
		o.prof.start(ctx, "kv-accept", span)
		defer func() { _ = o.prof.wait() }()
		deadline := time.Now().Add(span)
		more, skip = func(int) bool { return !time.Now().After(deadline) }, 0
	}
	var ts []time.Duration
	for i := 0; more(i); i++ {
		t0 := time.Now()
		id, err := lc.SubmitKV(ctx, s)
		if err != nil {
			return 0, err
		}
		if i >= skip {
			ts = append(ts, time.Since(t0))
		}
		if _, err := lc.Wait(ctx, id, 0); err != nil {
			return 0, err
		}
	}
	slices.Sort(ts)
	return ts[len(ts)/2], nil
}
