package kvlayout

import (
	"fmt"
	"slices"
	"strings"
)

// A preset builds the tensors of one engine's layer layout from Params.
type preset struct {
	mla   bool
	build func(p *Params) []Tensor
}

var presets = map[string]preset{
	// vLLM FlashAttention, NHD: (2, blocks, block_size, heads, head_size).
	"vllm-flash": {build: vllmFlash},
	"vllm-nhd":   {build: vllmFlash},
	// vLLM with the HND stride order (0, 1, 3, 2, 4): the logical shape of
	// vllm-flash, stored as (2, blocks, heads, block_size, head_size).
	"vllm-hnd": {build: vllmHND},
	// vLLM FlashInfer: (blocks, 2, block_size, heads, head_size).
	"vllm-flashinfer": {build: vllmFlashInfer},
	// vLLM packing K and V in the last dim (GPU backends, RFC #42082):
	// logical (blocks, heads, block_size, 2*head_size), K then V in each
	// token's row. vllm-packed (vllm-packed-hnd) stores it in that order
	// (HND); vllm-packed-nhd stores (blocks, block_size, heads, 2*head_size).
	"vllm-packed":     {build: vllmPacked},
	"vllm-packed-hnd": {build: vllmPacked},
	"vllm-packed-nhd": {build: vllmPackedNHD},
	// vLLM's CPU backend (CPU_ATTN): the same 4-D tensor, but its kernel reads
	// each (block, head) chunk as 2*block_size rows of head_size, K of the
	// block's tokens then V: (blocks, heads, 2, block_size, head_size).
	"vllm-cpu": {build: vllmCPU},
	// vLLM MLA: (blocks, block_size, kv_lora_rank+rope_dim), one part.
	"vllm-mla": {mla: true, build: vllmMLA},
	// vllm-ascend: K and V apart, each (blocks, block_size, heads, head_size).
	"ascend": {build: ascend},
	// vllm-ascend MLA: latent (blocks, block_size, 1, 512) and rope
	// (blocks, block_size, 1, 64), each 4-D with its one kv head.
	"ascend-mla": {mla: true, build: ascendMLA},
	// SGLang: k_buffer and v_buffer, each (tokens, heads, head_dim); a block is a page.
	"sglang": {build: sglang},
	// SGLang MLA: kv_buffer (tokens, 1, 576).
	"sglang-mla": {mla: true, build: sglangMLA},
}

// Presets lists the preset names, sorted.
func Presets() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// IsMLA reports whether a preset stores MLA's one latent row per token;
// MLA layouts meet only MLA layouts (their rows are wider than any head's).
func IsMLA(name string) bool { return presets[name].mla }

// Preset builds the named engine layout from p (see Params) and returns it
// with the byte length of each of its tensors.
func Preset(name string, p Params) (Layout, []uint64, error) {
	pr, ok := presets[name]
	if !ok {
		return Layout{}, nil, invalid("preset %q unknown; want one of %s", name, strings.Join(Presets(), ", "))
	}
	q := p
	if pr.mla {
		if err := mlaParams(&q); err != nil {
			return Layout{}, nil, fmt.Errorf("preset %s: %w", name, err)
		}
	} else if err := headParams(&q); err != nil {
		return Layout{}, nil, fmt.Errorf("preset %s: %w", name, err)
	}
	l, lens, err := FromStrides(q, pr.build(&q)...)
	if err != nil {
		return Layout{}, nil, fmt.Errorf("preset %s: %w", name, err)
	}
	return l, lens, nil
}

func headParams(p *Params) error {
	if p.HeadHi == 0 {
		p.HeadHi = p.Heads
	}
	switch {
	case p.HeadSize < 1:
		return invalid("head_size %d below the minimum 1", p.HeadSize)
	case p.Heads < 1:
		return invalid("heads %d below the minimum 1", p.Heads)
	case p.HeadLo >= p.HeadHi || p.HeadHi > p.Heads:
		return invalid("head slice [%d, %d) not inside [0, %d) or empty", p.HeadLo, p.HeadHi, p.Heads)
	case p.Blocks < 1 || p.BlockSize < 1:
		return invalid("blocks %d and block_size %d; want both at least 1", p.Blocks, p.BlockSize)
	}
	return fitsInt64(p, 2*uint64(p.HeadSize)*uint64(p.HeadHi-p.HeadLo))
}

// fitsInt64 refuses sizes whose tensors would have more elements than
// torch's int64 strides can index, before any stride is computed.
func fitsInt64(p *Params, rowElems uint64) error {
	n, ok := mul(uint64(p.Blocks), uint64(p.BlockSize))
	if ok {
		n, ok = mul(n, rowElems)
	}
	if !ok || n > 1<<62 {
		return invalid("blocks %d x block_size %d x %d elements per token: above 2^62 elements", p.Blocks, p.BlockSize, rowElems)
	}
	return nil
}

func mlaParams(p *Params) error {
	if p.Heads > 1 || p.HeadLo != 0 || p.HeadHi > 1 {
		return invalid("heads %d, slice [%d, %d): MLA stores one latent row per token (heads 1, slice [0, 1))", p.Heads, p.HeadLo, p.HeadHi)
	}
	p.Heads, p.HeadLo, p.HeadHi = 1, 0, 1
	switch len(p.Widths) {
	case 0:
		p.Widths = []uint32{512, 64}
	case 2:
		if p.Widths[0] < 1 || p.Widths[1] < 1 {
			return invalid("widths %v; want kv_lora_rank and rope_dim, both at least 1", p.Widths)
		}
	default:
		return invalid("%d widths; want 2 (kv_lora_rank, rope_dim)", len(p.Widths))
	}
	if w := uint64(p.Widths[0]) + uint64(p.Widths[1]); w > MaxRowWidth {
		return invalid("row width %d (widths %v) above the limit %d", w, p.Widths, MaxRowWidth)
	}
	if p.Blocks < 1 || p.BlockSize < 1 {
		return invalid("blocks %d and block_size %d; want both at least 1", p.Blocks, p.BlockSize)
	}
	return fitsInt64(p, uint64(p.Widths[0])+uint64(p.Widths[1]))
}

// contiguous gives the strides of a dense row-major tensor of shape.
func contiguous(shape ...int64) []int64 {
	st := make([]int64, len(shape))
	acc := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= shape[i]
	}
	return st
}

// permuted gives the strides of a tensor of logical shape whose memory
// holds the dims in the given order (vLLM's get_kv_cache_stride_order).
func permuted(shape []int64, order ...int) []int64 {
	phys := make([]int64, len(order))
	for i, d := range order {
		phys[i] = shape[d]
	}
	pst := contiguous(phys...)
	st := make([]int64, len(shape))
	for i, d := range order {
		st[d] = pst[i]
	}
	return st
}

func kvParts(hs uint32) []PartSpec { return []PartSpec{{"k", hs}, {"v", hs}} }

func dims(p *Params) (nb, bs, held, hs int64) {
	return int64(p.Blocks), int64(p.BlockSize), int64(p.HeadHi - p.HeadLo), int64(p.HeadSize)
}

func vllmFlash(p *Params) []Tensor {
	nb, bs, h, hs := dims(p)
	shape := []int64{2, nb, bs, h, hs}
	return []Tensor{{shape, contiguous(shape...), []Role{RolePart, RoleBlock, RoleSlot, RoleHead, RoleChannel}, kvParts(p.HeadSize)}}
}

func vllmHND(p *Params) []Tensor {
	nb, bs, h, hs := dims(p)
	shape := []int64{2, nb, bs, h, hs}
	return []Tensor{{shape, permuted(shape, 0, 1, 3, 2, 4), []Role{RolePart, RoleBlock, RoleSlot, RoleHead, RoleChannel}, kvParts(p.HeadSize)}}
}

func vllmFlashInfer(p *Params) []Tensor {
	nb, bs, h, hs := dims(p)
	shape := []int64{nb, 2, bs, h, hs}
	return []Tensor{{shape, contiguous(shape...), []Role{RoleBlock, RolePart, RoleSlot, RoleHead, RoleChannel}, kvParts(p.HeadSize)}}
}

func vllmPacked(p *Params) []Tensor {
	nb, bs, h, hs := dims(p)
	shape := []int64{nb, h, bs, 2 * hs}
	return []Tensor{{shape, contiguous(shape...), []Role{RoleBlock, RoleHead, RoleSlot, RoleChannel}, kvParts(p.HeadSize)}}
}

func vllmPackedNHD(p *Params) []Tensor {
	nb, bs, h, hs := dims(p)
	shape := []int64{nb, h, bs, 2 * hs}
	return []Tensor{{shape, permuted(shape, 0, 2, 1, 3), []Role{RoleBlock, RoleHead, RoleSlot, RoleChannel}, kvParts(p.HeadSize)}}
}

func vllmCPU(p *Params) []Tensor {
	nb, bs, h, hs := dims(p)
	shape := []int64{nb, h, 2, bs, hs}
	return []Tensor{{shape, contiguous(shape...), []Role{RoleBlock, RoleHead, RolePart, RoleSlot, RoleChannel}, kvParts(p.HeadSize)}}
}

func ascend(p *Params) []Tensor {
	nb, bs, h, hs := dims(p)
	shape := []int64{nb, bs, h, hs}
	roles := []Role{RoleBlock, RoleSlot, RoleHead, RoleChannel}
	return []Tensor{
		{shape, contiguous(shape...), roles, []PartSpec{{"k", p.HeadSize}}},
		{shape, contiguous(shape...), roles, []PartSpec{{"v", p.HeadSize}}},
	}
}

func sglang(p *Params) []Tensor {
	nb, bs, h, hs := dims(p)
	shape := []int64{nb * bs, h, hs}
	roles := []Role{RoleToken, RoleHead, RoleChannel}
	return []Tensor{
		{shape, contiguous(shape...), roles, []PartSpec{{"k", p.HeadSize}}},
		{shape, contiguous(shape...), roles, []PartSpec{{"v", p.HeadSize}}},
	}
}

func mlaWidth(p *Params) (int64, []PartSpec) {
	w := p.Widths[0] + p.Widths[1]
	return int64(w), []PartSpec{{"kv_c", w}}
}

func vllmMLA(p *Params) []Tensor {
	w, parts := mlaWidth(p)
	shape := []int64{int64(p.Blocks), int64(p.BlockSize), w}
	return []Tensor{{shape, contiguous(shape...), []Role{RoleBlock, RoleSlot, RoleChannel}, parts}}
}

func sglangMLA(p *Params) []Tensor {
	w, parts := mlaWidth(p)
	shape := []int64{int64(p.Blocks) * int64(p.BlockSize), 1, w}
	return []Tensor{{shape, contiguous(shape...), []Role{RoleToken, RoleHead, RoleChannel}, parts}}
}

func ascendMLA(p *Params) []Tensor {
	nb, bs := int64(p.Blocks), int64(p.BlockSize)
	roles := []Role{RoleBlock, RoleSlot, RoleHead, RoleChannel}
	lat := []int64{nb, bs, 1, int64(p.Widths[0])}
	rope := []int64{nb, bs, 1, int64(p.Widths[1])}
	return []Tensor{
		{lat, contiguous(lat...), roles, []PartSpec{{"latent", p.Widths[0]}}},
		{rope, contiguous(rope...), roles, []PartSpec{{"rope", p.Widths[1]}}},
	}
}
