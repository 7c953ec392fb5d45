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
	c, err := f.benchCaches(lc, rc)
	if err != nil {
		return nil, err
	}
	before, err := c.dst.Snapshot()
	if err != nil {
		return nil, err
	}
	runs, err := f.runs(lc, rc, c)
	if err != nil {
		return nil, err
	}
	l := &c.src.Layout
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
	if err := checkLanded(fmt.Sprintf("kv %s -> %s", o.from, o.to), c.dst, before, []*kvsim.KV{c.src}, c.conv); err != nil {
		return nil, err
	}
	printKVRows(w, o, l, bytes, rows)
	acc, err := kvAcceptRows(ctx, w, o)
	if err != nil {
		return nil, err
	}
	return append(rows, acc...), nil
}

// printKVRows prints the KV bench's table; rows[1] is the same-layout KV
// transfer, which every row is compared with.
func printKVRows(w io.Writer, o kvBenchOpts, l *kvlayout.Layout, bytes uint64, rows []kvRow) {
	fmt.Fprintf(w, "KV: %d layers x %d tokens x %d kv heads x row of %d elements, bf16: %s per transfer; %d timed rounds; %s -> %s; verified\n",
		o.layers, o.tokens, l.Held(), l.RowWidth(), config.ByteSize(bytes), o.iters, o.ldev, o.rdev)
	for _, row := range rows {
		fmt.Fprintf(w, "  %-48s %8.2f GB/s  %.2fx the same-layout KV transfer\n", row.What, row.GBps, row.GBps/rows[1].GBps)
	}
}

// kvBenchCaches is what the KV bench moves: src on the local engine, dst
// (of o.to) and same (of o.from) on the remote one, and the moves into
// each (conv converts the layout, ident does not).
type kvBenchCaches struct {
	src, dst, same *kvsim.KV
	conv, ident    kvsim.KVMove
}

// benchCaches makes the bench's caches and block tables.
func (f *kvFixture) benchCaches(lc, rc *client.Client) (*kvBenchCaches, error) {
	o := f.o
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
	return &kvBenchCaches{src: src, dst: dst, same: same, conv: conv, ident: ident}, nil
}

// runs is the bench's rows: the converting and the same-layout KV
// transfer, with o.grant the same-layout one under a grant each time, and
// the byte ops of the same-layout one where it has them.
func (f *kvFixture) runs(lc, rc *client.Client, c *kvBenchCaches) ([]kvRun, error) {
	ctx, o := f.ctx, *f.o
	kvOnce := func(m *kvsim.KVMove, to *kvsim.KV) func() error {
		return func() error {
			s := m.Submit(o.route, f.tag, wire.Push, c.src, to)
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
		{fmt.Sprintf("kv %s -> %s", o.from, o.to), kvOnce(&c.conv, c.dst)},
		{fmt.Sprintf("kv %s -> %s (same layout)", o.from, o.from), kvOnce(&c.ident, c.same)},
	}
	if o.grant {
		// Its own cache: a grant guards the cache it is made on.
		guarded, err := f.cache(rc, o.rdev, "guarded", o.from, false)
		if err != nil {
			return nil, err
		}
		runs = append(runs, kvRun{fmt.Sprintf("kv %s -> %s, Grant+Revoke each", o.from, o.from),
			grantedOnce(ctx, lc, rc, o, f.tag, &c.ident, c.src, guarded)})
	}
	if t, ok := c.src.ByteOps(c.same, &c.ident); ok {
		t.Route, t.Dir, t.Tag, t.Checksum = o.route, wire.Push, f.tag, o.checksum
		runs = append(runs, kvRun{fmt.Sprintf("byte ops, same blocks (%d ops)", len(t.Ops)), func() error {
			_, err := lc.Do(ctx, t)
			return err
		}})
	}
	return runs, nil
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
