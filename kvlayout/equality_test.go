package kvlayout

import (
	"fmt"
	"math/rand"
	"testing"
)

// tpSplit is a tensor-parallel pairing: the source's ranks and the
// destination's, each holding an equal share of the heads.
type tpSplit struct{ src, dst int }

var tpSplits = []tpSplit{{1, 1}, {1, 2}, {2, 1}, {1, 4}, {4, 1}, {2, 4}, {4, 2}}

var blockSizes = []uint32{16, 64, 128}

// headSlices gives the head slice of each of n ranks over heads heads; with
// more ranks than heads a head is held by several ranks (GQA replication).
func headSlices(heads uint32, n int) [][2]uint32 {
	out := make([][2]uint32, n)
	for i := range out {
		if uint32(n) <= heads {
			out[i] = [2]uint32{uint32(i) * heads / uint32(n), uint32(i+1) * heads / uint32(n)}
		} else {
			h := uint32(i) * heads / uint32(n)
			out[i] = [2]uint32{h, h + 1}
		}
	}
	return out
}

// kvCase is one logical-row equality case: a source preset with its TP
// degree and block size, a destination likewise, one model shape.
type kvCase struct {
	src, dst     string
	srcBS, dstBS uint32
	tp           tpSplit
	dtype        DType
	heads        uint32
	headSize     uint32
	widths       []uint32
	seed         int64
	order        Order // BlockMajor: both sides block-major, first tokens aligned
}

func (c kvCase) String() string {
	return fmt.Sprintf("%s.bs%d.tp%d->%s.bs%d.tp%d/%s/h%d/%s", c.src, c.srcBS, c.tp.src, c.dst, c.dstBS, c.tp.dst, c.dtype, c.heads, c.order)
}

// run moves a request's KV from every source rank to every destination
// rank, each destination head from the first source rank that holds it,
// and checks every destination tensor byte: moved rows equal the source's
// logical rows and everything else is untouched.
func (c kvCase) run(t *testing.T) {
	r := rand.New(rand.NewSource(c.seed))
	const layers = 3
	tokens := 1 + uint64(r.Intn(300))
	order := r.Perm(layers)[:1+r.Intn(layers)] // the transfer's layers, in its own order
	params := func(bs uint32, lo, hi uint32) Params {
		return Params{DType: c.dtype, BlockSize: bs, Heads: c.heads, HeadLo: lo, HeadHi: hi, HeadSize: c.headSize, Widths: c.widths}
	}
	srcs := make([]*rank, c.tp.src)
	srcFirst := uint64(r.Intn(2 * int(c.srcBS)))
	for i, sl := range headSlices(c.heads, c.tp.src) {
		srcs[i] = newRank(t, r, c.src, params(c.srcBS, sl[0], sl[1]), layers, srcFirst, tokens)
		srcs[i].order = c.order
		srcs[i].fill(order, tokens)
	}
	dstFirst := uint64(r.Intn(2 * int(c.dstBS)))
	if c.order == BlockMajor {
		dstFirst = srcFirst%uint64(c.srcBS) + uint64(r.Intn(2))*uint64(c.dstBS)
	}
	for _, sl := range headSlices(c.heads, c.tp.dst) {
		dst := newRank(t, r, c.dst, params(c.dstBS, sl[0], sl[1]), layers, dstFirst, tokens)
		dst.order = c.order
		if c.order == BlockMajor && !BlockMajorFits(srcs[0].l, dst.l, srcFirst, dstFirst) {
			t.Fatalf("case does not fit block-major order")
		}
		want := dst.clone()
		for h := sl[0]; h < sl[1]; {
			si := 0
			for srcs[si].l.HeadLo > h || srcs[si].l.HeadHi <= h {
				si++
			}
			src := srcs[si]
			hi := min(sl[1], src.l.HeadHi)
			if err := Check(src.l, dst.l); err != nil {
				t.Fatalf("Check: %v", err)
			}
			cols := Columns(src.l, dst.l)
			ss, st := src.side(t, order, tokens, h, hi, cols)
			ds, dt := dst.side(t, order, tokens, h, hi, cols)
			moveKV(t, r, ss, st, ds, dt)
			rowBytes := src.l.RowWidth() * src.l.DType.Size()
			for _, li := range order {
				for tok := uint64(0); tok < tokens; tok++ {
					for hh := h; hh < hi; hh++ {
						want.putRow(li, dstFirst+tok, hh, logicalRow(li, srcFirst+tok, hh, rowBytes))
					}
				}
			}
			h = hi
		}
		if err := equalTensors(dst, want); err != nil {
			t.Fatalf("destination heads [%d, %d), %d tokens from %d to %d, layers %v: %v", sl[0], sl[1], tokens, srcFirst, dstFirst, order, err)
		}
	}
}

var dtypes = []DType{F16, BF16, F32, FP8E4M3, FP8E5M2, Int8}

// TestLogicalRowsEveryPair moves KV between every ordered pair of
// compatible presets (MLA with MLA, the rest with the rest), block sizes
// 16, 64 and 128 on each side and TP splits 1-2-4 both ways, with random
// block tables, token counts, first tokens, layer orders and chunk cuts.
// In -short mode each (pair, block sizes) runs one TP split, rotating.
func TestLogicalRowsEveryPair(t *testing.T) {
	seed := int64(1)
	for _, src := range Presets() {
		for _, dst := range Presets() {
			if IsMLA(src) != IsMLA(dst) {
				continue
			}
			for bi, sbs := range blockSizes {
				for bj, dbs := range blockSizes {
					splits := tpSplits
					if IsMLA(src) {
						splits = []tpSplit{{1, 1}, {1, 2}, {2, 1}} // one head, replicated
					}
					if testing.Short() {
						k := (bi*3 + bj + len(src) + len(dst)) % len(splits)
						splits = splits[k : k+1]
					}
					for _, tp := range splits {
						seed++
						c := kvCase{src: src, dst: dst, srcBS: sbs, dstBS: dbs, tp: tp, heads: 8, headSize: 4, seed: seed,
							dtype: dtypes[seed%int64(len(dtypes))]}
						if IsMLA(src) {
							c.heads, c.widths = 1, []uint32{24, 8}
						}
						t.Run(c.String(), c.run)
					}
				}
			}
		}
	}
}

// TestLogicalRowsBlockMajor: the block-major order between layouts that
// keep a head's tokens together (HND, packed K|V, one-head slices), same
// block size on both sides, first tokens aligned, every TP split.
func TestLogicalRowsBlockMajor(t *testing.T) {
	seed := int64(1000)
	for _, src := range []string{"vllm-hnd", "vllm-packed", "vllm-cpu"} {
		for _, dst := range []string{"vllm-hnd", "vllm-packed", "vllm-cpu"} {
			for _, bs := range []uint32{1, 16, 64} {
				for _, tp := range tpSplits {
					seed++
					c := kvCase{src: src, dst: dst, srcBS: bs, dstBS: bs, tp: tp, heads: 8, headSize: 4, seed: seed,
						dtype: dtypes[seed%int64(len(dtypes))], order: BlockMajor}
					t.Run(c.String(), c.run)
				}
			}
		}
	}
}

// TestLogicalRowsShapes covers real row widths (head size 128, MLA's
// 512+64) and GQA replication (2 kv heads over 4 ranks).
func TestLogicalRowsShapes(t *testing.T) {
	cases := []kvCase{
		{src: "ascend", dst: "vllm-hnd", srcBS: 128, dstBS: 16, tp: tpSplit{2, 1}, dtype: BF16, heads: 8, headSize: 128},
		{src: "ascend", dst: "vllm-packed", srcBS: 128, dstBS: 16, tp: tpSplit{2, 1}, dtype: BF16, heads: 8, headSize: 128},
		{src: "vllm-flash", dst: "ascend", srcBS: 16, dstBS: 128, tp: tpSplit{1, 2}, dtype: F16, heads: 8, headSize: 128},
		{src: "vllm-mla", dst: "ascend-mla", srcBS: 64, dstBS: 128, tp: tpSplit{1, 1}, dtype: BF16, heads: 1},
		{src: "ascend-mla", dst: "sglang-mla", srcBS: 128, dstBS: 1, tp: tpSplit{1, 1}, dtype: BF16, heads: 1},
		{src: "vllm-flash", dst: "vllm-hnd", srcBS: 16, dstBS: 16, tp: tpSplit{1, 4}, dtype: BF16, heads: 2, headSize: 8},
		{src: "vllm-hnd", dst: "sglang", srcBS: 16, dstBS: 1, tp: tpSplit{4, 1}, dtype: BF16, heads: 2, headSize: 8},
		{src: "vllm-flashinfer", dst: "vllm-flash", srcBS: 1, dstBS: 3, tp: tpSplit{1, 1}, dtype: Int8, heads: 3, headSize: 5},
		{src: "ascend", dst: "vllm-cpu", srcBS: 128, dstBS: 16, tp: tpSplit{2, 1}, dtype: BF16, heads: 8, headSize: 128},
		{src: "vllm-packed-nhd", dst: "ascend", srcBS: 16, dstBS: 128, tp: tpSplit{1, 2}, dtype: BF16, heads: 8, headSize: 128},
		{src: "vllm-cpu", dst: "vllm-packed-nhd", srcBS: 32, dstBS: 16, tp: tpSplit{4, 1}, dtype: F16, heads: 2, headSize: 8},
	}
	for i, c := range cases {
		c.seed = int64(1000 + i)
		t.Run(c.String(), c.run)
	}
}

// TestLogicalRowsVLLMPacked4D moves KV between the presets of vLLM's one
// 4-D tensor (packed K|V stored NHD, the CPU backend's K-then-V blocks)
// and vllm-flash, vllm-hnd, vllm-packed and ascend, both ways, block 128
// against 16 and 32 and 32 against 16, every TP split.
func TestLogicalRowsVLLMPacked4D(t *testing.T) {
	seed := int64(2000)
	sizes := [][2]uint32{{128, 16}, {128, 32}, {16, 128}, {32, 128}, {32, 16}}
	for _, a := range []string{"vllm-packed-nhd", "vllm-cpu"} {
		for _, b := range []string{"vllm-flash", "vllm-hnd", "vllm-packed", "ascend", "vllm-packed-nhd", "vllm-cpu"} {
			for _, pair := range [][2]string{{a, b}, {b, a}} {
				for _, bs := range sizes {
					for _, tp := range tpSplits {
						seed++
						c := kvCase{src: pair[0], dst: pair[1], srcBS: bs[0], dstBS: bs[1], tp: tp, heads: 8, headSize: 4, seed: seed,
							dtype: dtypes[seed%int64(len(dtypes))]}
						t.Run(c.String(), c.run)
					}
				}
			}
		}
	}
}
