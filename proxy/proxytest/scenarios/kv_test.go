package scenarios_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// kvCache makes and registers a synthetic KV cache on n, filled (seed != 0)
// or poisoned.
func kvCache(t *testing.T, sc *proxytest.Sidecar, name, preset string, p kvlayout.Params, layers int, seed uint64) *kvsim.KV {
	t.Helper()
	return kvCacheNamed(t, sc, sc.Name+"-"+name, preset, p, layers, seed)
}

// kvCacheNamed is kvCache with the cache's full name (identical decodes
// register caches of one name).
func kvCacheNamed(t *testing.T, sc *proxytest.Sidecar, name, preset string, p kvlayout.Params, layers int, seed uint64) *kvsim.KV {
	t.Helper()
	return kvCacheAccess(t, sc, name, preset, p, layers, seed, wire.AccessAll)
}

// kvCacheAccess is kvCacheNamed with the regions' access rights.
func kvCacheAccess(t *testing.T, sc *proxytest.Sidecar, name, preset string, p kvlayout.Params, layers int, seed uint64, access wire.Access) *kvsim.KV {
	t.Helper()
	k, register := kvCacheLater(t, sc, name, preset, p, layers, seed, access)
	if err := register(); err != nil {
		t.Fatal(err)
	}
	return k
}

// kvCacheLater makes the cache of kvCacheAccess and returns it with the
// function that registers it (from any goroutine), for tests of what comes
// before an engine registers.
func kvCacheLater(t *testing.T, sc *proxytest.Sidecar, name, preset string, p kvlayout.Params, layers int, seed uint64, access wire.Access) (*kvsim.KV, func() error) {
	t.Helper()
	k, err := kvsim.NewKV(name, preset, p, layers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close() })
	if seed != 0 {
		err = k.Fill(seed)
	} else {
		err = k.Poison(guard)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for l := 0; l < k.Layers; l++ {
			for tn := range k.Layout.NumTensors() {
				_ = sc.Client.Unregister(context.Background(), k.Region(l, tn))
			}
		}
	})
	return k, func() error { return k.Register(context.Background(), sc.Client, access) }
}

// perm32 is a block table of distinct random block ids below blocks,
// enough for first+tokens tokens in blocks of bs tokens.
func perm32(r *rand.Rand, blocks, bs, first, tokens uint32) []uint32 {
	ids := r.Perm(int(blocks))[:(first+tokens+bs-1)/bs]
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}

// doKV submits KV transfers at once and waits for every one.
func doKV(t *testing.T, cl *client.Client, subs []wire.SubmitKV) {
	t.Helper()
	ctx := context.Background()
	var ids []uint64
	for i, s := range subs {
		id, err := cl.SubmitKV(ctx, s)
		if err != nil {
			t.Fatalf("KV transfer %d (%s): %v", i, s.Tag, err)
		}
		ids = append(ids, id)
	}
	for i, id := range ids {
		st, err := cl.Wait(ctx, id, 60*time.Second)
		if err != nil {
			t.Fatalf("KV transfer %d (%s): %v", i, subs[i].Tag, err)
		}
		if st.State != wire.StateDone || st.Done != st.Total {
			t.Fatalf("KV transfer %d: state %s, %d of %d B", i, st.State, st.Done, st.Total)
		}
	}
}

// landed checks the moves' rows landed in dst as src held them and every
// other byte of dst is as want had it before (what says which cache).
func landed(t *testing.T, what string, src, dst *kvsim.KV, want []byte, moves ...kvsim.KVMove) {
	t.Helper()
	if err := kvsim.Expect(src, dst, want, moves...); err != nil {
		t.Fatal(err)
	}
	got, err := dst.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sameBytes(t, what, got, want)
}

func sameBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: first difference at byte %d of %d: got %#x, want %#x", what, i, len(want), got[i], want[i])
		}
	}
}

// TestKVConvert moves KV caches between sidecars whose engines lay them
// out differently: two "ranks" of an Ascend-layout prefill (block 128, K
// and V apart, half the heads each) push into one vLLM HND decode (block
// 16, all heads), requests of random lengths into random block tables;
// then the decode pulls them back into a packed-layout cache. Every moved
// row must equal its source row and every other byte stay as it was.
func TestKVConvert(t *testing.T) {
	o := e2eOpts()
	o.SlotSize = 256 * config.KiB
	pre, dec := proxytest.Pair(t, o)
	const layers, heads, hs = 3, 8, 64
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 7))
	t.Logf("seed %d", seed)
	params := func(bs, blocks, lo, hi uint32) kvlayout.Params {
		return kvlayout.Params{DType: kvlayout.BF16, Blocks: blocks, BlockSize: bs, Heads: heads, HeadLo: lo, HeadHi: hi, HeadSize: hs}
	}
	rank0 := kvCache(t, pre, "rank0", "ascend", params(128, 24, 0, 4), layers, seed)
	rank1 := kvCache(t, pre, "rank1", "ascend", params(128, 24, 4, 8), layers, seed+1)
	back := kvCache(t, pre, "back", "vllm-packed", params(64, 48, 0, 8), layers, 0)
	hnd := kvCache(t, dec, "hnd", "vllm-hnd", params(16, 192, 0, 8), layers, 0)

	wantDec, err := hnd.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var subs []wire.SubmitKV
	var moves0, moves1 []kvsim.KVMove
	var back0 []kvsim.KVMove
	// Requests get disjoint blocks on the receiving sides, as an engine's
	// allocator gives them.
	decFree, backFree := r.Perm(192), r.Perm(48)
	take := func(free *[]int, n uint32) []uint32 {
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = uint32((*free)[0])
			*free = (*free)[1:]
		}
		return ids
	}
	for req := 0; req < 6; req++ {
		tokens := uint32(1 + r.IntN(400))
		first := uint32(r.IntN(3)) * 16
		dst := take(&decFree, (first+tokens+15)/16)
		src := perm32(r, 24, 128, 0, tokens)
		all := []int{0, 1, 2}
		m := kvsim.KVMove{Layers: all, SrcTable: src, DstTable: dst, DstFirst: first, Tokens: tokens}
		moves0 = append(moves0, m)
		subs = append(subs, m.Submit(route, fmt.Sprintf("req-%d/r0", req), wire.Push, rank0, hnd))
		m1 := m
		m1.SrcTable = perm32(r, 24, 128, 0, tokens)
		moves1 = append(moves1, m1)
		subs = append(subs, m1.Submit(route, fmt.Sprintf("req-%d/r1", req), wire.Push, rank1, hnd))
		// Pulled back from the decode into the packed cache.
		bm := kvsim.KVMove{Layers: all, SrcTable: dst, SrcFirst: first, DstTable: take(&backFree, (5+tokens+63)/64), DstFirst: 5, Tokens: tokens}
		back0 = append(back0, bm)
	}
	notes, err := dec.Client.Subscribe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	doKV(t, pre.Client, subs)
	// Each push is announced to the decode's engine once all of it
	// landed, naming the cache, layers and tokens.
	seen := map[string]bool{}
	for range subs {
		select {
		case n := <-notes:
			var want *wire.SubmitKV
			for i := range subs {
				if subs[i].Tag == n.Tag {
					want = &subs[i]
				}
			}
			if want == nil || seen[n.Tag] || n.Code != wire.CodeOK || n.KV != hnd.Name || n.First != want.RemoteFirst ||
				n.Tokens != want.Tokens || fmt.Sprint(n.Layers) != fmt.Sprint(want.Layers) {
				t.Fatalf("notify %+v does not match a push", n)
			}
			seen[n.Tag] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d notifications after 10s", len(seen), len(subs))
		}
	}
	if err := kvsim.Expect(rank0, hnd, wantDec, moves0...); err != nil {
		t.Fatal(err)
	}
	if err := kvsim.Expect(rank1, hnd, wantDec, moves1...); err != nil {
		t.Fatal(err)
	}
	got, err := hnd.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "decode cache after the pushes", got, wantDec)

	wantBack, err := back.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var pulls []wire.SubmitKV
	for i, m := range back0 {
		pulls = append(pulls, m.Submit(route, fmt.Sprintf("back-%d", i), wire.Pull, back, hnd))
	}
	doKV(t, pre.Client, pulls)
	landed(t, "packed cache after the pulls", hnd, back, wantBack, back0...)
}

// TestKVRefused: a KV transfer the layouts or tables cannot carry is
// refused before any byte moves, with an error that names both values.
func TestKVRefused(t *testing.T) {
	pre, dec := proxytest.Pair(t, e2eOpts())
	p := kvlayout.Params{DType: kvlayout.BF16, Blocks: 8, BlockSize: 16, Heads: 8, HeadLo: 0, HeadHi: 8, HeadSize: 64}
	src := kvCache(t, pre, "src", "vllm-flash", p, 2, 1)
	q := p
	q.DType = kvlayout.F16
	f16 := kvCache(t, dec, "f16", "vllm-flash", q, 2, 0)
	q = p
	q.HeadSize = 128
	wide := kvCache(t, dec, "wide", "vllm-flash", q, 2, 0)
	q = p
	q.HeadLo, q.HeadHi = 0, 4
	half := kvCache(t, dec, "half", "vllm-flash", q, 2, 0)
	ok := kvCache(t, dec, "ok", "vllm-hnd", p, 2, 0)
	before, err := ok.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	base := kvsim.KVMove{Layers: []int{0, 1}, SrcTable: []uint32{0, 1}, DstTable: []uint32{2, 3}, Tokens: 20}
	for _, tt := range []struct {
		name string
		sub  wire.SubmitKV
		want string
	}{
		{"dtype", base.Submit(route, "a", wire.Push, src, f16), "dtype bf16 here, f16 at the peer"},
		{"row width", base.Submit(route, "b", wire.Push, src, wide), "row width (elements) 128 here, 256 at the peer"},
		{"heads outside", func() wire.SubmitKV {
			s := base.Submit(route, "c", wire.Push, src, half)
			s.HeadLo, s.HeadHi = 2, 6
			return s
		}(), "kv heads [2, 6) asked for; here [0, 8), at the peer [0, 4)"},
		{"remote block id", func() wire.SubmitKV {
			s := base.Submit(route, "d", wire.Push, src, ok)
			s.RemoteBlocks = []uint32{2, 8}
			return s
		}(), "entry 1 is block 8; its cache has 8 blocks"},
		{"remote table short", func() wire.SubmitKV {
			s := base.Submit(route, "e", wire.Push, src, ok)
			s.RemoteFirst = 13
			return s
		}(), "needs tokens [13, 33)"},
		{"local table short", func() wire.SubmitKV {
			s := base.Submit(route, "f", wire.Push, src, ok)
			s.LocalFirst = 13
			return s
		}(), "KV cache \"prefill-src\""},
		{"layer", func() wire.SubmitKV {
			s := base.Submit(route, "g", wire.Push, src, ok)
			s.Layers = []uint32{0, 2}
			return s
		}(), "has 2 layers; the transfer names layer 2"},
		{"unknown peer named", func() wire.SubmitKV {
			s := base.Submit(route, "i", wire.Push, src, ok)
			s.Peer = "decode-1"
			return s
		}(), `route "decode" has no peer "decode-1" (peers: decode at `},
		{"no cache", func() wire.SubmitKV {
			s := base.Submit(route, "h", wire.Push, src, ok)
			s.Remote = "nope"
			return s
		}(), "has no KV cache \"nope\""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := pre.Client.SubmitKV(context.Background(), tt.sub)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
	after, err := ok.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "decode cache after refused transfers", after, before)
}

// TestKVRegionAccessRaw: the regions of a KV cache refuse the byte-range
// transfers their access does not grant, as any region does. A hostile
// peer pushes raw bytes into a prefill's cache (remote read only) and
// pulls a decode's (remote write only): both refused, the caches
// untouched; the same ops in the granted direction go through. Over TCP
// and between sidecars on one node.
func TestKVRegionAccessRaw(t *testing.T) {
	local := wire.AccessLocalRead | wire.AccessLocalWrite
	for _, tt := range []struct {
		name string
		opts func(t *testing.T) proxytest.Options
	}{
		{"tcp", func(*testing.T) proxytest.Options { return e2eOpts() }},
		{"same node", oneNode},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pre, dec := proxytest.Pair(t, tt.opts(t))
			p := kvlayout.Params{DType: kvlayout.F16, Blocks: 8, BlockSize: 16, Heads: 4, HeadHi: 4, HeadSize: 32}
			own := kvCache(t, pre, "own", "vllm-flash", p, 1, 5)
			prefill := kvCacheAccess(t, dec, "victim-prefill", "vllm-flash", p, 1, 6, local|wire.AccessRemoteRead)
			decode := kvCacheAccess(t, dec, "victim-decode", "vllm-flash", p, 1, 7, local|wire.AccessRemoteWrite)
			m := kvsim.KVMove{Layers: []int{0}, SrcTable: []uint32{0, 1}, DstTable: []uint32{2, 3}, Tokens: 32}
			for _, op := range []struct {
				what   string
				dir    wire.Direction
				victim *kvsim.KV
				want   wire.Code
			}{
				{"push into the prefill's cache", wire.Push, prefill, wire.CodeAccessDenied},
				{"pull from the decode's cache", wire.Pull, decode, wire.CodeAccessDenied},
				{"pull from the prefill's cache", wire.Pull, prefill, wire.CodeOK},
				{"push into the decode's cache", wire.Push, decode, wire.CodeOK},
			} {
				before, err := op.victim.Snapshot()
				if err != nil {
					t.Fatal(err)
				}
				tr, ok := own.ByteOps(op.victim, &m)
				if !ok {
					t.Fatalf("%s: no byte ops for the move", op.what)
				}
				tr.Route, tr.Dir, tr.Tag = route, op.dir, "raw"
				got := wire.CodeOK
				if _, err = pre.Client.Do(context.Background(), tr); err != nil {
					got = client.CodeOf(err)
				}
				if got != op.want {
					t.Fatalf("raw %s: got %v (code %v), want code %v", op.what, err, got, op.want)
				}
				if op.want != wire.CodeOK {
					after, err := op.victim.Snapshot()
					if err != nil {
						t.Fatal(err)
					}
					sameBytes(t, op.what+" (refused)", after, before)
				}
			}
		})
	}
}

// TestKVRegisteredLate: a KV push asked for before the decode's engine
// registered its cache (it is registering again after its sidecar
// restarted, and the push ticket came first) waits for the registration
// and lands, instead of failing with "no KV cache" and being recomputed.
// Over TCP, a push and a pull.
func TestKVRegisteredLate(t *testing.T) {
	o := e2eOpts()
	o.Metrics = true
	pre, dec := proxytest.Pair(t, o)
	p := kvlayout.Params{DType: kvlayout.F16, Blocks: 16, BlockSize: 16, Heads: 4, HeadHi: 4, HeadSize: 32}
	src := kvCache(t, pre, "src", "vllm-flash", p, 2, 3)
	dst, register := kvCacheLater(t, dec, "dst", "vllm-flash", p, 2, 0, wire.AccessAll)
	want, err := dst.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	m := kvsim.KVMove{Layers: []int{0, 1}, SrcTable: []uint32{5, 1, 9}, DstTable: []uint32{2, 7, 3}, Tokens: 40}
	lateKV(t, pre, dec, m.Submit(route, "late", wire.Push, src, dst), register)
	landed(t, "decode cache", src, dst, want, m)

	// A pull from a decode cache registered late.
	from, register2 := kvCacheLater(t, dec, "from", "vllm-flash", p, 2, 11, wire.AccessAll)
	into := kvCache(t, pre, "into", "vllm-flash", p, 2, 0)
	want, err = into.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	lateKV(t, pre, dec, m.Submit(route, "late-pull", wire.Pull, into, from), register2)
	landed(t, "prefill cache after the pull", from, into, want, m)

	// Each sidecar counted its waits: the decode the push's shape
	// question and the pull's, both answered once the cache came; a
	// question for a cache that never comes, after the wait.
	s := m.Submit(route, "never", wire.Push, src, dst)
	s.Remote = "never"
	if _, err := pre.Client.SubmitKV(context.Background(), s); err == nil || !strings.Contains(err.Error(), `has no KV cache "never"`) {
		t.Fatalf("a push into a cache never registered: %v", err)
	}
	metricsAre(t, dec, map[string]float64{
		`stage_kv_waits_total{for="registration",result="came"}`:      2,
		`stage_kv_waits_total{for="registration",result="timed_out"}`: 1,
		`stage_kv_waiting{for="registration"}`:                        0,
	})
}

// lateKV runs sub from pre and registers dec's cache once dec shows the
// transfer's shape question waiting for it (whatever the machine's pace);
// the transfer must end only after that, and well.
func lateKV(t *testing.T, pre, dec *proxytest.Sidecar, sub wire.SubmitKV, register func() error) {
	t.Helper()
	done := waiting(t, dec, "registration", func() error { return kvRun(t, pre.Client, sub) })
	if err := register(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("%s into a cache registered late: %v", sub.Tag, err)
	}
}

// TestKVSameNode: between sidecars on one node, a KV transfer converts on
// the TCP path and counts the same-node path it did not take.
func TestKVSameNode(t *testing.T) {
	pre, dec := proxytest.Pair(t, oneNode(t))
	p := kvlayout.Params{DType: kvlayout.F16, Blocks: 16, BlockSize: 16, Heads: 4, HeadHi: 4, HeadSize: 32}
	src := kvCache(t, pre, "src", "vllm-flash", p, 2, 3)
	q := p
	q.BlockSize = 64
	dst := kvCache(t, dec, "dst", "vllm-packed", q, 2, 0)
	want, err := dst.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	m := kvsim.KVMove{Layers: []int{1, 0}, SrcTable: []uint32{9, 2, 7, 4, 1}, DstTable: []uint32{3, 0}, DstFirst: 10, Tokens: 75}
	doKV(t, pre.Client, []wire.SubmitKV{m.Submit(route, "sn", wire.Push, src, dst)})
	landed(t, "decode cache", src, dst, want, m)
	if l := link(t, pre, route); l.Fallbacks["kv_layout"] != 1 || l.ChunksOut == 0 {
		t.Fatalf("link decode: fallbacks %v, %d chunks out; want kv_layout counted once and TCP used", l.Fallbacks, l.ChunksOut)
	}
}

// TestKVBlockMajor: between layouts that keep a head's tokens together
// (HND, packed K|V) with one block size, transfers whose first tokens sit
// at the same slot of a block move in block-major order, the others in
// token-major order; rows land right either way.
func TestKVBlockMajor(t *testing.T) { kvBlockMajor(t, e2eOpts()) }

// kvBlockMajor is TestKVBlockMajor between sidecars of options o, with
// slots of 64 KiB.
func kvBlockMajor(t *testing.T, o proxytest.Options) {
	o.SlotSize = 64 * config.KiB
	pre, dec := proxytest.Pair(t, o)
	p := kvlayout.Params{DType: kvlayout.BF16, Blocks: 64, BlockSize: 16, Heads: 4, HeadHi: 4, HeadSize: 32}
	src := kvCache(t, pre, "hnd", "vllm-hnd", p, 2, 11)
	dst := kvCache(t, dec, "packed", "vllm-packed", p, 2, 0)
	want, err := dst.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	free := r.Perm(64)
	take := func(n uint32) []uint32 {
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = uint32(free[0])
			free = free[1:]
		}
		return ids
	}
	moves := []kvsim.KVMove{
		{Layers: []int{0, 1}, SrcTable: take(6), DstTable: take(6), SrcFirst: 3, DstFirst: 3, Tokens: 80}, // aligned: block-major
		{Layers: []int{1}, SrcTable: take(5), DstTable: take(5), SrcFirst: 0, DstFirst: 16, Tokens: 64},   // aligned, whole blocks
		{Layers: []int{0, 1}, SrcTable: take(5), DstTable: take(6), SrcFirst: 2, DstFirst: 9, Tokens: 70}, // not aligned: token-major
	}
	var subs []wire.SubmitKV
	for i, m := range moves {
		subs = append(subs, m.Submit(route, fmt.Sprintf("bm-%d", i), wire.Push, src, dst))
	}
	doKV(t, pre.Client, subs)
	landed(t, "packed cache", src, dst, want, moves...)
}

// TestKVSplitHeads: a prefill holding all kv heads pushes into two decode
// caches holding half each (each transfer moves its decode's slice), and,
// with GQA replication, into caches that each hold one of 2 kv heads
// twice over (4 "ranks" of 2 heads).
func TestKVSplitHeads(t *testing.T) {
	pre, dec := proxytest.Pair(t, e2eOpts())
	cases := []struct {
		name   string
		heads  uint32
		slices [][2]uint32
	}{
		{"all heads to two halves", 8, [][2]uint32{{0, 4}, {4, 8}}},
		{"GQA: 2 heads to 4 ranks", 2, [][2]uint32{{0, 1}, {0, 1}, {1, 2}, {1, 2}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := kvlayout.Params{DType: kvlayout.F16, Blocks: 32, BlockSize: 16, Heads: c.heads, HeadHi: c.heads, HeadSize: 16}
			src := kvCache(t, pre, "full-"+fmt.Sprint(c.heads), "vllm-flash", p, 2, 5)
			m := kvsim.KVMove{Layers: []int{0, 1}, SrcTable: []uint32{7, 3, 12}, DstTable: []uint32{1, 2}, SrcFirst: 4, DstFirst: 9, Tokens: 40}
			for i, sl := range c.slices {
				q := kvlayout.Params{DType: kvlayout.F16, Blocks: 8, BlockSize: 32, Heads: c.heads, HeadLo: sl[0], HeadHi: sl[1], HeadSize: 16}
				dst := kvCache(t, dec, fmt.Sprintf("rank%d-%d", i, c.heads), "ascend", q, 2, 0)
				want, err := dst.Snapshot()
				if err != nil {
					t.Fatal(err)
				}
				doKV(t, pre.Client, []wire.SubmitKV{m.Submit(route, fmt.Sprintf("split-%d", i), wire.Push, src, dst)})
				landed(t, fmt.Sprintf("rank %d holding heads [%d, %d)", i, sl[0], sl[1]), src, dst, want, m)
			}
		})
	}
}
