package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// kvBenchOpts is what `stagectl bench --kv A:B` measures.
type kvBenchOpts struct {
	route, local, remote string
	ldev, rdev           engineDevice
	from, to             kvPresetArg
	layers               int
	tokens               uint32
	heads, headSize      uint32
	iters, warmup        int
	checksum             uint8
	prof                 *profiler // nil: no profiles
	grant                bool      // also a row with a grant per transfer
}

// kvPresetArg is "PRESET[/BLOCK_SIZE]".
type kvPresetArg struct {
	name string
	bs   uint32
}

// parseKVArg parses "A[/bs]:B[/bs]"; a block size left out is the
// engine's usual one (128 for Ascend presets, 16 for the rest).
func parseKVArg(s string) (from, to kvPresetArg, err error) {
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		return from, to, fmt.Errorf("--kv wants FROM:TO, preset names with an optional /BLOCK_SIZE (presets: %s)", strings.Join(kvlayout.Presets(), ", "))
	}
	parse := func(x string) (kvPresetArg, error) {
		name, bs, _ := strings.Cut(x, "/")
		p := kvPresetArg{name: name, bs: 16}
		if strings.HasPrefix(name, "ascend") {
			p.bs = 128
		}
		if bs != "" {
			n, err := strconv.ParseUint(bs, 10, 32)
			if err != nil || n == 0 {
				return p, fmt.Errorf("--kv %q: block size %q is not a positive number", x, bs)
			}
			p.bs = uint32(n)
		}
		if !slices.Contains(kvlayout.Presets(), name) {
			return p, fmt.Errorf("--kv: preset %q unknown (presets: %s)", name, strings.Join(kvlayout.Presets(), ", "))
		}
		return p, nil
	}
	if from, err = parse(a); err != nil {
		return from, to, err
	}
	to, err = parse(b)
	return from, to, err
}

func (p kvPresetArg) String() string { return fmt.Sprintf("%s/%d", p.name, p.bs) }

// kvRow is one line of the KV bench's table.
type kvRow struct {
	What  string  `json:"what"`
	Bytes uint64  `json:"bytes_per_transfer"`
	GBps  float64 `json:"gb_per_s"`
}

// newKV allocates a synthetic KV cache where d says.
func newKV(d engineDevice, name string, p kvPresetArg, o *kvBenchOpts, blocks uint32) (*kvsim.KV, error) {
	params := kvlayout.Params{DType: kvlayout.BF16, Blocks: blocks, BlockSize: p.bs, Heads: o.heads, HeadHi: o.heads, HeadSize: o.headSize}
	if kvlayout.IsMLA(p.name) {
		params.Heads, params.HeadHi, params.HeadSize = 1, 1, 0
	}
	return newKVOn(d, name, p.name, params, o.layers)
}

// newKVOn allocates a synthetic KV cache of preset where d says.
func newKVOn(d engineDevice, name, preset string, params kvlayout.Params, layers int) (*kvsim.KV, error) {
	if d.kind == "hostmem" {
		return kvsim.NewKV(name, preset, params, layers)
	}
	size, err := kvsim.KVSize(preset, params, layers)
	if err != nil {
		return nil, err
	}
	dev, err := cudaDevice(d.ordinal)
	if err != nil {
		return nil, err
	}
	m, err := kvsim.NewCUDAMemory(dev, size)
	if err != nil {
		return nil, err
	}
	return kvsim.NewKVOn(m, name, preset, params, layers)
}

// checkLanded checks dst against want once each source's move m has been
// applied to want (kvsim.Expect): every row moved landed, and every other
// byte is as it was.
func checkLanded(what string, dst *kvsim.KV, want []byte, srcs []*kvsim.KV, m kvsim.KVMove) error {
	for _, src := range srcs {
		if err := kvsim.Expect(src, dst, want, m); err != nil {
			return err
		}
	}
	got, err := dst.Snapshot()
	if err != nil {
		return err
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("%s: destination byte %d is %#x, want %#x", what, i, got[i], want[i])
		}
	}
	return nil
}

// unregisterKV unregisters every region of k from cl and returns the first
// error.
func unregisterKV(ctx context.Context, cl *client.Client, k *kvsim.KV) error {
	var first error
	for l := 0; l < k.Layers; l++ {
		for t := range k.Layout.NumTensors() {
			if err := cl.Unregister(ctx, k.Region(l, t)); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// runKVBench moves a synthetic KV cache of o.tokens tokens from preset
// o.from (local) to o.to (remote), and in the same run between two caches
// of o.from (same layout, as a KV transfer and as the byte ops it
// amounts to), and prints GB/s of KV moved for each.
func runKVBench(ctx context.Context, w io.Writer, o kvBenchOpts) ([]kvRow, error) {
	lc, err := client.Dial(o.local)
	if err != nil {
		return nil, err
	}
	defer lc.Close()
	rc, err := client.Dial(o.remote)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	f := &kvFixture{ctx: ctx, o: &o, r: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1)),
		tag: fmt.Sprintf("kvbench-%d", time.Now().UnixNano()%1e6)}
	defer f.close()
	src, err := f.cache(lc, o.ldev, "src", o.from, true)
	if err != nil {
		return nil, err
	}
	dst, err := f.cache(rc, o.rdev, "dst", o.to, false)
	if err != nil {
		return nil, err
	}
	same, err := f.cache(rc, o.rdev, "same", o.from, false)
	if err != nil {
		return nil, err
	}
	layers := make([]int, o.layers)
	for i := range layers {
		layers[i] = i
	}
	conv := kvsim.KVMove{Layers: layers, SrcTable: f.table(o.from), DstTable: f.table(o.to), Tokens: o.tokens}
	ident := kvsim.KVMove{Layers: layers, SrcTable: conv.SrcTable, DstTable: f.table(o.from), Tokens: o.tokens}
	before, err := dst.Snapshot()
	if err != nil {
		return nil, err
	}
	kvOnce := func(m *kvsim.KVMove, to *kvsim.KV) func() error {
		return func() error {
			s := m.Submit(o.route, f.tag, wire.Push, src, to)
			s.Checksum = o.checksum
			id, err := lc.SubmitKV(ctx, s)
			if err != nil {
				return err
			}
			_, err = lc.Wait(ctx, id, 0)
			return err
		}
	}
	runs := []kvRun{
		{fmt.Sprintf("kv %s -> %s", o.from, o.to), kvOnce(&conv, dst)},
		{fmt.Sprintf("kv %s -> %s (same layout)", o.from, o.from), kvOnce(&ident, same)},
	}
	if o.grant {
		// Its own cache: a grant guards the cache it is made on.
		guarded, err := f.cache(rc, o.rdev, "guarded", o.from, false)
		if err != nil {
			return nil, err
		}
		runs = append(runs, kvRun{fmt.Sprintf("kv %s -> %s, Grant+Revoke each", o.from, o.from),
			grantedOnce(ctx, lc, rc, o, f.tag, &ident, src, guarded)})
	}
	if t, ok := src.ByteOps(same, &ident); ok {
		t.Route, t.Dir, t.Tag, t.Checksum = o.route, wire.Push, f.tag, o.checksum
		runs = append(runs, kvRun{fmt.Sprintf("byte ops, same blocks (%d ops)", len(t.Ops)), func() error {
			_, err := lc.Do(ctx, t)
			return err
		}})
	}
	l := &src.Layout
	bytes := uint64(o.layers) * uint64(o.tokens) * uint64(l.Held()) * l.RowWidth() * l.DType.Size()
	busy, err := timeKVRuns(ctx, o, runs)
	if err != nil {
		return nil, err
	}
	rows := make([]kvRow, len(runs))
	for i := range runs {
		rows[i] = kvRow{What: runs[i].what, Bytes: bytes, GBps: float64(bytes) * float64(o.iters) / busy[i].Seconds() / 1e9}
	}
	// Every row of the converting transfer must have landed, and nothing
	// else in the destination changed.
	if err := checkLanded(fmt.Sprintf("kv %s -> %s", o.from, o.to), dst, before, []*kvsim.KV{src}, conv); err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "KV: %d layers x %d tokens x %d kv heads x row of %d elements, bf16: %s per transfer; %d timed rounds; %s -> %s; verified\n",
		o.layers, o.tokens, l.Held(), l.RowWidth(), config.ByteSize(bytes), o.iters, o.ldev, o.rdev)
	for _, row := range rows {
		fmt.Fprintf(w, "  %-48s %8.2f GB/s  %.2fx the same-layout KV transfer\n", row.What, row.GBps, row.GBps/rows[1].GBps)
	}
	acc, err := kvAcceptRows(ctx, w, o)
	if err != nil {
		return nil, err
	}
	return append(rows, acc...), nil
}

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

// kvFixture makes the KV bench's caches and block tables, and undoes what
// it made (unregisters and frees the caches) on close.
type kvFixture struct {
	ctx  context.Context
	o    *kvBenchOpts
	r    *rand.Rand
	tag  string
	undo []func()
}

// blocks is how many blocks a cache of preset p has: twice what a request
// needs, so that block tables are scattered.
func (f *kvFixture) blocks(p kvPresetArg) uint32 { return 2 * ((f.o.tokens + p.bs - 1) / p.bs) }

// cache makes a cache of preset p on d, filled with random bytes or
// poisoned, and registers it with cl.
func (f *kvFixture) cache(cl *client.Client, d engineDevice, name string, p kvPresetArg, fill bool) (*kvsim.KV, error) {
	k, err := newKV(d, f.tag+"-"+name, p, f.o, f.blocks(p))
	if err != nil {
		return nil, fmt.Errorf("%s cache %s: %w", name, p, err)
	}
	f.undo = append(f.undo, func() { _ = k.Close() })
	if fill {
		err = k.Fill(f.r.Uint64())
	} else {
		err = k.Poison(0xAB)
	}
	if err != nil {
		return nil, err
	}
	if err := k.Register(f.ctx, cl, wire.AccessAll); err != nil {
		return nil, err
	}
	f.undo = append(f.undo, func() { _ = unregisterKV(context.Background(), cl, k) })
	return k, nil
}

// table is a random block table of a request of o.tokens tokens in a
// cache of preset p.
func (f *kvFixture) table(p kvPresetArg) []uint32 {
	return randTable(f.r, int(f.blocks(p)), int((f.o.tokens+p.bs-1)/p.bs))
}

// close undoes what the fixture made, last first.
func (f *kvFixture) close() {
	for i := len(f.undo) - 1; i >= 0; i-- {
		f.undo[i]()
	}
}

// kvRun is one row of the KV bench: what it measures, and one transfer of it.
type kvRun struct {
	what string
	once func() error
}

// timeKVRuns runs each of runs o.warmup + o.iters times and returns the
// time each spent in the timed rounds. Rounds interleave the rows, so that
// drift on a shared machine hits them alike.
func timeKVRuns(ctx context.Context, o kvBenchOpts, runs []kvRun) ([]time.Duration, error) {
	busy := make([]time.Duration, len(runs))
	for round := 0; round < o.warmup+o.iters; round++ {
		if o.prof != nil && round == o.warmup {
			// Each row is profiled separately below; here the whole
			// round, about as long as the warm-up took.
			o.prof.start(ctx, "kv-rounds", time.Duration(o.iters)*sum(busy))
		}
		for i, rn := range runs {
			t0 := time.Now()
			if err := rn.once(); err != nil {
				return nil, fmt.Errorf("%s: %w", rn.what, err)
			}
			if round >= o.warmup {
				busy[i] += time.Since(t0)
			}
		}
	}
	if o.prof != nil {
		if err := o.prof.wait(); err != nil {
			return nil, err
		}
	}
	return busy, nil
}

// grantedOnce is one push of m from src into to, a cache of the remote
// engine, as the vLLM connector's decode does it: the remote engine grants
// writes into m's blocks under a fresh key, the push names it, and the
// grant is revoked after.
func grantedOnce(ctx context.Context, lc, rc *client.Client, o kvBenchOpts, tag string, m *kvsim.KVMove, src, to *kvsim.KV) func() error {
	return func() error {
		key, err := client.GrantKey()
		if err != nil {
			return err
		}
		if err := rc.Grant(ctx, to.Name, key, true, m.DstTable, time.Minute, 0); err != nil {
			return fmt.Errorf("grant: %w", err)
		}
		s := m.Submit(o.route, tag, wire.Push, src, to)
		s.Checksum, s.Key = o.checksum, key
		id, err := lc.SubmitKV(ctx, s)
		if err == nil {
			_, err = lc.Wait(ctx, id, 0)
		}
		if err != nil {
			return err
		}
		return rc.RevokeGrant(ctx, to.Name, key)
	}
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

// randTable is n distinct block ids of the first pool, in random order.
func randTable(r *rand.Rand, pool, n int) []uint32 {
	ids := r.Perm(pool)[:n]
	out := make([]uint32, n)
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}

func sum(ds []time.Duration) (t time.Duration) {
	for _, d := range ds {
		t += d
	}
	return t
}
