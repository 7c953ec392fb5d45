package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// The KV phase's request: 8 layers, 8 kv heads, rows of 128 elements,
// 2048 tokens.
const demoKVLayers, demoKVHeads, demoKVHeadSize, demoKVTokens = 8, 8, 128, 2048

// kvPhase is the demo's last phase, what stage is for: a request's KV
// cache prefilled by two tensor-parallel ranks in vllm-ascend's layout (K
// and V apart, block 128, half the kv heads each) lands in one decode
// cache in vLLM's HND layout (block 16, all heads), each sidecar mapping
// the rows to its own layout. Every decode byte is checked: moved rows
// equal to the ranks' rows, every other byte untouched.
func kvPhase(ctx context.Context, pc, dc *client.Client, notes <-chan *wire.Notify, pdev, ddev engineDevice) (res phaseResult, err error) {
	var kc demoKVCaches
	defer func() {
		for _, k := range kc.made {
			err = errors.Join(err, k.Close())
		}
	}()
	if err := kc.open(ctx, pc, dc, pdev, ddev); err != nil {
		return res, err
	}
	want, err := kc.hnd.Snapshot()
	if err != nil {
		return res, err
	}
	m := demoKVMove(demoKVTokens)
	// Two passes, as every demo phase (demophase.go): the first into the
	// fresh registrations, the timed one into the poisoned cache again.
	for pass, prefix := range []string{"kv-first/", "kv-req-1/"} {
		if pass == 1 {
			if err := kc.hnd.Poison(0xAB); err != nil {
				return res, err
			}
		}
		el, n, err := kvPass(ctx, pc, notes, &m, kc.ranks, kc.hnd, prefix)
		if err != nil {
			return res, err
		}
		if pass == 0 {
			res.first = el
		} else {
			res.elapsed, res.xfers, res.notes = el, len(kc.ranks), n
		}
	}
	if err := checkLanded("KV phase: the decode cache", kc.hnd, want, kc.ranks, m); err != nil {
		return res, err
	}
	for _, err := range []error{unregisterKV(ctx, pc, kc.ranks[0]), unregisterKV(ctx, pc, kc.ranks[1]), unregisterKV(ctx, dc, kc.hnd)} {
		if err != nil {
			return res, err
		}
	}
	bytes := uint64(demoKVLayers) * demoKVTokens * demoKVHeads * 2 * demoKVHeadSize * 2
	res.name, res.bytes = "kv ascend/128 x2 -> vllm-hnd/16", bytes
	return res, nil
}

// demoKVCaches is the KV phase's caches: the prefill ranks' on the
// prefill engine, filled, and the decode's on the decode engine, poisoned.
type demoKVCaches struct {
	ranks []*kvsim.KV
	hnd   *kvsim.KV
	made  []*kvsim.KV // every cache made, for the phase to close, even when open failed
}

// open makes and registers the caches.
func (kc *demoKVCaches) open(ctx context.Context, pc, dc *client.Client, pdev, ddev engineDevice) error {
	params := func(bs, blocks, lo, hi uint32) kvlayout.Params {
		return kvlayout.Params{DType: kvlayout.BF16, Blocks: blocks, BlockSize: bs, Heads: demoKVHeads, HeadLo: lo, HeadHi: hi, HeadSize: demoKVHeadSize}
	}
	mk := func(d engineDevice, cl *client.Client, name, preset string, p kvlayout.Params) (*kvsim.KV, error) {
		k, err := newKVOn(d, name, preset, p, demoKVLayers)
		if err != nil {
			return nil, fmt.Errorf("KV cache %s: %w", name, err)
		}
		kc.made = append(kc.made, k)
		return k, k.Register(ctx, cl, wire.AccessAll)
	}
	for i, sl := range [][2]uint32{{0, demoKVHeads / 2}, {demoKVHeads / 2, demoKVHeads}} {
		k, err := mk(pdev, pc, fmt.Sprintf("ascend-rank%d", i), "ascend", params(128, 32, sl[0], sl[1]))
		if err != nil {
			return err
		}
		if err := k.Fill(uint64(7 + i)); err != nil {
			return err
		}
		kc.ranks = append(kc.ranks, k)
	}
	hnd, err := mk(ddev, dc, "vllm-hnd", "vllm-hnd", params(16, 256, 0, demoKVHeads))
	if err != nil {
		return err
	}
	kc.hnd = hnd
	return hnd.Poison(0xAB)
}

// kvPass pushes m from every rank into hnd, tagged under prefix, and
// returns the time from the first submit to the last transfer done, and
// how many notifications of them the decode engine got.
func kvPass(ctx context.Context, pc *client.Client, notes <-chan *wire.Notify, m *kvsim.KVMove, ranks []*kvsim.KV, hnd *kvsim.KV, prefix string) (time.Duration, int, error) {
	start := time.Now()
	var ids []uint64
	for i, k := range ranks {
		id, err := pc.SubmitKV(ctx, m.Submit("decode", fmt.Sprintf("%srank%d", prefix, i), wire.Push, k, hnd))
		if err != nil {
			return 0, 0, fmt.Errorf("KV push of rank %d: %w", i, err)
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		if _, err := pc.Wait(ctx, id, 0); err != nil {
			return 0, 0, fmt.Errorf("KV transfer %d: %w", id, err)
		}
	}
	el := time.Since(start)
	n, err := collectNotes(notes, len(ids), prefix, wire.Push)
	return el, n, err
}

// demoKVMove is the KV phase's request of tokens tokens, over all 8
// layers: scattered block ids on both sides, as engines' allocators give
// them, 128-token blocks at the ranks and 16-token blocks at the decode,
// where it starts 5 tokens into its first block.
func demoKVMove(tokens uint32) kvsim.KVMove {
	m := kvsim.KVMove{Layers: []int{0, 1, 2, 3, 4, 5, 6, 7}, SrcTable: []uint32{9, 2, 30, 17, 5, 11, 24, 0, 13, 28, 6, 19, 3, 22, 15, 8},
		DstTable: make([]uint32, (tokens+5+15)/16), DstFirst: 5, Tokens: tokens}
	for i := range m.DstTable {
		m.DstTable[i] = uint32((i*37 + 11) % 256)
	}
	m.SrcTable = m.SrcTable[:(tokens+127)/128]
	return m
}
