package acl

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// KV transfers from an "Ascend" sidecar: two tensor-parallel ranks of a
// vllm-ascend cache (K and V apart, block 128, half the kv heads each) on
// the acl sidecar push every request into one decode cache holding all
// heads in another engine's layout and block size. The acl side moves its
// NHD rows with plain copies; the decode side maps its own layout.

// kvRequests runs requests random-length requests through both ranks into
// dec's cache (layout decPreset, block decBS) and checks every byte of the
// decode cache: moved rows equal to the ranks' rows, the rest untouched.
// npu and peer allocate memory on the acl and the decode side.
func kvRequests(t *testing.T, pre, dec *node, decPreset string, decBS uint32, requests int, npu, peer func(size uint64) kvsim.Memory) {
	t.Helper()
	ctx := context.Background()
	const layers, heads, hs, maxTokens = 4, 8, 128, 1024
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 9))
	params := func(bs, blocks, lo, hi uint32) kvlayout.Params {
		return kvlayout.Params{DType: kvlayout.BF16, Blocks: blocks, BlockSize: bs, Heads: heads, HeadLo: lo, HeadHi: hi, HeadSize: hs}
	}
	// Each request gets its own blocks on every side, as an engine's
	// allocator gives them.
	npuBlocks := uint32(requests) * ((maxTokens + 127) / 128)
	decBlocks := uint32(requests) * ((maxTokens + 2*decBS - 1) / decBS)
	mk := func(mem func(uint64) kvsim.Memory, cl *node, name, preset string, p kvlayout.Params) *kvsim.KV {
		size, err := kvsim.KVSize(preset, p, layers)
		if err != nil {
			t.Fatal(err)
		}
		m := mem(size)
		k, err := kvsim.NewKVOn(m, name, preset, p, layers)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k.Close() })
		if err := k.Register(ctx, cl.cl, wire.AccessAll); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for l := 0; l < layers; l++ {
				for tn := range k.Layout.NumTensors() {
					_ = cl.cl.Unregister(context.Background(), k.Region(l, tn))
				}
			}
		})
		return k
	}
	ranks := []*kvsim.KV{
		mk(npu, pre, "rank0", "ascend", params(128, npuBlocks, 0, heads/2)),
		mk(npu, pre, "rank1", "ascend", params(128, npuBlocks, heads/2, heads)),
	}
	for i, k := range ranks {
		if err := k.Fill(seed + uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	out := mk(peer, dec, "decode", decPreset, params(decBS, decBlocks, 0, heads))
	if err := out.Poison(guardByte); err != nil {
		t.Fatal(err)
	}
	want, err := out.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	npuFree, decFree := r.Perm(int(npuBlocks)), r.Perm(int(decBlocks))
	take := func(free *[]int, n uint32) []uint32 {
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = uint32((*free)[0])
			*free = (*free)[1:]
		}
		return ids
	}
	moves := make([][]kvsim.KVMove, len(ranks))
	var ids []uint64
	start := time.Now()
	var moved uint64
	for q := 0; q < requests; q++ {
		tokens := uint32(1 + r.IntN(maxTokens))
		first := uint32(r.IntN(int(decBS)))
		src := take(&npuFree, (tokens+127)/128)
		dst := take(&decFree, (first+tokens+decBS-1)/decBS)
		for i, k := range ranks {
			m := kvsim.KVMove{Layers: []int{0, 1, 2, 3}, SrcTable: src, DstTable: dst, DstFirst: first, Tokens: tokens}
			moves[i] = append(moves[i], m)
			id, err := pre.cl.SubmitKV(ctx, m.Submit("decode", fmt.Sprintf("req-%d/rank%d", q, i), wire.Push, k, out))
			if err != nil {
				t.Fatalf("request %d rank %d: %v", q, i, err)
			}
			ids = append(ids, id)
			moved += uint64(layers) * uint64(tokens) * heads / 2 * 2 * hs * 2
		}
	}
	for _, id := range ids {
		st, err := pre.cl.Wait(ctx, id, 120*time.Second)
		if err != nil || st.State != wire.StateDone {
			t.Fatalf("transfer %d: %v, %+v", id, err, st)
		}
	}
	el := time.Since(start)
	for i, k := range ranks {
		if err := kvsim.Expect(k, out, want, moves[i]...); err != nil {
			t.Fatal(err)
		}
	}
	got, err := out.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("decode cache byte %d of %d: %#x, want %#x", i, len(got), got[i], want[i])
			}
		}
	}
	t.Logf("%d requests, 2 ascend ranks -> %s/%d: %d MiB of KV in %v (%.2f GB/s), every row equal, nothing else touched",
		requests, decPreset, decBS, moved>>20, el.Round(time.Millisecond), float64(moved)/el.Seconds()/1e9)
}

// npuMemory allocates fake-ACL device memory exported to the acl
// sidecar of pid.
func npuMemory(t *testing.T, d *Device, pid int32) func(size uint64) kvsim.Memory {
	return func(size uint64) kvsim.Memory {
		m, err := newACLMemory(d, size, pid)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
}

// TestE2EKVFromAscend: fake ACL over host memory to a hostmem decode in
// vLLM's HND and packed layouts, block 16; and an HND layout refused on
// the acl sidecar, which moves rows with plain copies only.
func TestE2EKVFromAscend(t *testing.T) {
	bin := stagedBinary(t)
	so := buildFake(t)
	dec := startNode(t, bin, "decode", nodeOpts{})
	pre := startNode(t, bin, "ascend", nodeOpts{route: "decode", peer: dec.peers, stripes: 4,
		extra: "device:\n  kind: acl\n  ordinal: 0\n", env: stagedEnv(so, CopyAuto)})
	pre.settle(1)
	dec.settle(1)
	l := openFakeSO(t, so, true)
	d := openDev(t, l, Config{})
	npu := npuMemory(t, d, int32(pre.cmd.Process.Pid))
	host := func(size uint64) kvsim.Memory {
		m, err := kvsim.NewHostMemory("kv", size)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, preset := range []string{"vllm-hnd", "vllm-packed"} {
		t.Run(preset, func(t *testing.T) { kvRequests(t, pre, dec, preset, 16, 12, npu, host) })
	}
	t.Run("HND refused on acl", func(t *testing.T) {
		p := kvlayout.Params{DType: kvlayout.BF16, Blocks: 4, BlockSize: 16, Heads: 8, HeadHi: 8, HeadSize: 64}
		size, err := kvsim.KVSize("vllm-hnd", p, 1)
		if err != nil {
			t.Fatal(err)
		}
		k, err := kvsim.NewKVOn(npu(size), "hnd", "vllm-hnd", p, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		err = k.Register(context.Background(), pre.cl, wire.AccessAll)
		if err == nil || !strings.Contains(err.Error(), "the acl backend moves KV rows with plain copies") {
			t.Fatalf("registering an HND layout on the acl sidecar: %v, want a refusal naming the plain copies", err)
		}
		_ = pre.cl.Unregister(context.Background(), k.Region(0, 0))
	})
	pre.checkIdle()
	dec.checkIdle()
}
