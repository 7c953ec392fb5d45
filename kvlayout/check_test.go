package kvlayout

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func mustPreset(t testing.TB, name string, p Params) Layout {
	t.Helper()
	l, _, err := Preset(name, p)
	if err != nil {
		t.Fatalf("Preset(%s): %v", name, err)
	}
	return l
}

// TestCheckRefusals: each check of Check refuses with both sides' values.
func TestCheckRefusals(t *testing.T) {
	base := Params{DType: BF16, Blocks: 4, BlockSize: 16, Heads: 8, HeadSize: 128}
	with := func(f func(*Params)) Params { p := base; f(&p); return p }
	here := mustPreset(t, "ascend", base)
	cases := []struct {
		name string
		peer Layout
		want string
	}{
		{"dtype", mustPreset(t, "vllm-hnd", with(func(p *Params) { p.DType = F16 })), "kv layout mismatch: dtype bf16 here, f16 at the peer"},
		{"row width", mustPreset(t, "vllm-hnd", with(func(p *Params) { p.HeadSize = 64 })), "row width (elements) 256 here, 128 at the peer"},
		{"heads", mustPreset(t, "vllm-hnd", with(func(p *Params) { p.Heads = 16 })), "total kv heads 8 here, 16 at the peer"},
		{"MLA against heads", mustPreset(t, "vllm-mla", Params{DType: BF16, Blocks: 4, BlockSize: 16, Widths: []uint32{192, 64}}), "total kv heads 8 here, 1 at the peer"},
	}
	for _, c := range cases {
		err := Check(here, c.peer)
		if err == nil || !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Check = %v; want ErrMismatch %q", c.name, err, c.want)
		}
	}
	lo := mustPreset(t, "ascend", with(func(p *Params) { p.HeadLo, p.HeadHi = 0, 4 }))
	hi := mustPreset(t, "vllm-hnd", with(func(p *Params) { p.HeadLo, p.HeadHi = 4, 8 }))
	if err := Check(lo, hi); err == nil || !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "head slices [0, 4) here and [4, 8) at the peer share no head") {
		t.Errorf("disjoint slices: Check = %v", err)
	}
	mid := mustPreset(t, "vllm-hnd", with(func(p *Params) { p.HeadLo, p.HeadHi = 2, 6 }))
	if err := Check(lo, mid); err != nil {
		t.Errorf("slices [0,4) and [2,6): %v", err)
	}
	if a, b := Overlap(lo, mid); a != 2 || b != 4 {
		t.Errorf("Overlap = [%d, %d), want [2, 4)", a, b)
	}
}

func TestColumns(t *testing.T) {
	p := Params{DType: BF16, Blocks: 2, BlockSize: 16, Heads: 2, HeadSize: 64}
	mla := Params{DType: BF16, Blocks: 2, BlockSize: 16}
	cases := []struct {
		a, b string
		pa   Params
		want []Col
	}{
		{"vllm-mla", "ascend-mla", mla, []Col{{0, 512}, {512, 576}}},
		{"ascend-mla", "vllm-mla", mla, []Col{{0, 512}, {512, 576}}},
		{"vllm-mla", "sglang-mla", mla, []Col{{0, 576}}},
		{"vllm-packed", "ascend", p, []Col{{0, 64}, {64, 128}}},
	}
	for _, c := range cases {
		got := Columns(mustPreset(t, c.a, c.pa), mustPreset(t, c.b, c.pa))
		if !slices.Equal(got, c.want) {
			t.Errorf("Columns(%s, %s) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
	// Parts cut at different places: 3+5 against 4+4 gives 3, 1, 4.
	a := Layout{Parts: []Part{{Width: 3}, {Width: 5}}}
	b := Layout{Parts: []Part{{Width: 4}, {Width: 4}}}
	if got, want := Columns(a, b), []Col{{0, 3}, {3, 4}, {4, 8}}; !slices.Equal(got, want) {
		t.Errorf("Columns(3+5, 4+4) = %v, want %v", got, want)
	}
	if got := Columns(a, Layout{Parts: []Part{{Width: 9}}}); got != nil {
		t.Errorf("Columns of rows 8 and 9 wide = %v, want nil", got)
	}
}

// TestFromStrides describes tensors the way torch gives them and checks
// the layout against the preset of the same engine.
func TestFromStrides(t *testing.T) {
	p := Params{DType: F16, Blocks: 5, BlockSize: 16, Heads: 4, HeadSize: 32}
	want := mustPreset(t, "vllm-hnd", p)
	// A vLLM HND cache: logical shape (2, 5, 16, 4, 32), stored as
	// (2, 5, 4, 16, 32): strides in elements as tensor.stride() gives.
	hnd := Tensor{
		Shape:   []int64{2, 5, 16, 4, 32},
		Strides: []int64{5 * 4 * 16 * 32, 4 * 16 * 32, 32, 16 * 32, 1},
		Roles:   []Role{RolePart, RoleBlock, RoleSlot, RoleHead, RoleChannel},
		Parts:   []PartSpec{{"k", 32}, {"v", 32}},
	}
	got, lens, err := FromStrides(Params{DType: F16, Heads: 4}, hnd)
	if err != nil || !slices.Equal(got.Parts, want.Parts) || got.Blocks != 5 || got.BlockSize != 16 || got.HeadHi != 4 {
		t.Fatalf("FromStrides(HND) = %+v, %v; want %+v", got, err, want)
	}
	if lens[0] != 2*5*16*4*32*2 {
		t.Errorf("HND tensor length %d, want %d", lens[0], 2*5*16*4*32*2)
	}
	// The same cache given as two views of K and V with a size-1 dim.
	sg := Tensor{Shape: []int64{80, 1, 4, 32}, Strides: []int64{128, 128, 32, 1}, Roles: []Role{RoleToken, RoleNone, RoleHead, RoleChannel}, Parts: []PartSpec{{"k", 32}}}
	sgv := sg
	sgv.Parts = []PartSpec{{"v", 32}}
	got, _, err = FromStrides(Params{DType: F16, Heads: 8, HeadLo: 4, BlockSize: 16}, sg, sgv)
	if err != nil || got.Blocks != 5 || got.HeadLo != 4 || got.HeadHi != 8 || got.Parts[1].Tensor != 1 || got.Parts[0].BlockStride != 16*128*2 {
		t.Errorf("FromStrides(sglang, heads [4, 8)) = %+v, %v", got, err)
	}

	bad := func(f func(*Tensor)) Tensor {
		c := hnd
		c.Shape, c.Strides, c.Roles = slices.Clone(hnd.Shape), slices.Clone(hnd.Strides), slices.Clone(hnd.Roles)
		f(&c)
		return c
	}
	refusals := []struct {
		name string
		p    Params
		t    []Tensor
		want string
	}{
		{"no tensors", Params{DType: F16}, nil, "0 tensors"},
		{"dtype", Params{}, []Tensor{hnd}, "dtype invalid"},
		{"ranks differ", Params{DType: F16}, []Tensor{bad(func(c *Tensor) { c.Roles = c.Roles[:4] })}, "shape has 5 dims, strides 5, roles 4"},
		{"negative stride", Params{DType: F16}, []Tensor{bad(func(c *Tensor) { c.Strides[2] = -32 })}, "dim 2 (slot): stride -32 is negative"},
		{"zero size", Params{DType: F16}, []Tensor{bad(func(c *Tensor) { c.Shape[1] = 0 })}, "dim 1 (block): size 0"},
		{"role twice", Params{DType: F16}, []Tensor{bad(func(c *Tensor) { c.Roles[3] = RoleSlot })}, "dim 3: role slot given twice"},
		{"no role", Params{DType: F16}, []Tensor{bad(func(c *Tensor) { c.Roles[3] = RoleNone })}, "dim 3: size 4 with no role"},
		{"channel stride", Params{DType: F16}, []Tensor{bad(func(c *Tensor) { c.Strides[4] = 2 })}, "channel stride 2"},
		{"no channel", Params{DType: F16}, []Tensor{bad(func(c *Tensor) { c.Roles[4] = RoleHead; c.Roles[3] = RoleNone; c.Shape[3] = 1 })}, "no dim has role channel"},
		{"no slot", Params{DType: F16}, []Tensor{bad(func(c *Tensor) { c.Roles[2] = RoleNone; c.Shape[2] = 1 })}, "no block and slot dims"},
		{"token without page", Params{DType: F16}, []Tensor{sg}, "block_size 0 for a token dimension"},
		{"token not whole", Params{DType: F16, BlockSize: 7}, []Tensor{sg}, "token dim of 80 tokens is not a whole number of blocks of 7"},
		{"part dim size", Params{DType: F16}, []Tensor{bad(func(c *Tensor) { c.Parts = c.Parts[:1] })}, "part dim of size 2, but 1 parts named"},
		{"part width", Params{DType: F16}, []Tensor{bad(func(c *Tensor) { c.Parts = []PartSpec{{"k", 32}, {"v", 16}} })}, "parts[1].width 16, but the channel dim holds 32"},
		{"widths sum", Params{DType: F16, BlockSize: 16}, []Tensor{{Shape: []int64{80, 4, 32}, Strides: []int64{128, 32, 1}, Roles: []Role{RoleToken, RoleHead, RoleChannel}, Parts: []PartSpec{{"k", 16}, {"v", 8}}}}, "parts' widths sum to 24, but the channel dim holds 32"},
		{"tensors disagree", Params{DType: F16, Heads: 4, BlockSize: 16}, []Tensor{sg, {Shape: []int64{160, 4, 32}, Strides: []int64{128, 32, 1}, Roles: []Role{RoleToken, RoleHead, RoleChannel}, Parts: []PartSpec{{"v", 32}}}},
			"tensor 1 holds 10 blocks of 16 tokens and 4 heads, tensor 0 5 blocks of 16 tokens and 4 heads"},
		{"head_hi", Params{DType: F16, Heads: 8, HeadHi: 8}, []Tensor{hnd}, "head_hi 8, but head_lo 0 plus the 4 heads"},
		{"overlapping strides", Params{DType: F16, Heads: 4}, []Tensor{bad(func(c *Tensor) { c.Strides[3] = 16 })}, "rows overlap"},
	}
	for _, c := range refusals {
		if _, _, err := FromStrides(c.p, c.t...); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: FromStrides = %v; want ErrInvalid naming %q", c.name, err, c.want)
		}
	}
}
