package kvlayout

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestDType(t *testing.T) {
	cases := []struct {
		name string
		d    DType
		size uint64
	}{{"f16", F16, 2}, {"bf16", BF16, 2}, {"f32", F32, 4}, {"fp8_e4m3", FP8E4M3, 1}, {"fp8_e5m2", FP8E5M2, 1}, {"int8", Int8, 1}}
	for _, c := range cases {
		d, err := ParseDType(c.name)
		if err != nil || d != c.d || d.Size() != c.size || d.String() != c.name {
			t.Errorf("ParseDType(%q) = %v (size %d, %q), %v; want %v size %d", c.name, d, d.Size(), d.String(), err, c.d, c.size)
		}
	}
	for _, bad := range []string{"", "BF16", "fp8", "invalid", "float16"} {
		if d, err := ParseDType(bad); err == nil || d != DTypeInvalid {
			t.Errorf("ParseDType(%q) = %v, %v; want an error", bad, d, err)
		}
	}
	if DTypeInvalid.Valid() || DType(200).Size() != 0 || DType(200).String() != "dtype(200)" {
		t.Errorf("invalid dtypes: %v %d %q", DTypeInvalid.Valid(), DType(200).Size(), DType(200).String())
	}
}

// TestPresetShapes checks presets against the engines' shapes worked by
// hand: 3 blocks of 16 tokens, 2 held heads of size 8, bf16 (e = 2).
func TestPresetShapes(t *testing.T) {
	p := Params{DType: BF16, Blocks: 3, BlockSize: 16, Heads: 4, HeadLo: 2, HeadHi: 4, HeadSize: 8}
	mla := Params{DType: BF16, Blocks: 3, BlockSize: 16}
	part := func(name string, w uint32, tensor int, off, b, s, h uint64) Part {
		return Part{Name: name, Width: w, Tensor: tensor, Offset: off, BlockStride: b, SlotStride: s, HeadStride: h}
	}
	cases := []struct {
		name  string
		p     Params
		parts []Part
		lens  []uint64
	}{
		// (2, 3, 16, 2, 8): a block is 16*2*8*2 = 512 bytes, a K half 1536.
		{"vllm-flash", p, []Part{part("k", 8, 0, 0, 512, 32, 16), part("v", 8, 0, 1536, 512, 32, 16)}, []uint64{3072}},
		{"vllm-nhd", p, []Part{part("k", 8, 0, 0, 512, 32, 16), part("v", 8, 0, 1536, 512, 32, 16)}, []uint64{3072}},
		// stored (2, 3, 2, 16, 8): a head's tokens are 16*8*2 = 256 bytes.
		{"vllm-hnd", p, []Part{part("k", 8, 0, 0, 512, 16, 256), part("v", 8, 0, 1536, 512, 16, 256)}, []uint64{3072}},
		// (3, 2, 16, 2, 8): K and V of a block side by side.
		{"vllm-flashinfer", p, []Part{part("k", 8, 0, 0, 1024, 32, 16), part("v", 8, 0, 512, 1024, 32, 16)}, []uint64{3072}},
		// (3, 2, 16, 16): a token's row is K|V, 32 bytes.
		{"vllm-packed", p, []Part{part("k", 8, 0, 0, 1024, 32, 512), part("v", 8, 0, 16, 1024, 32, 512)}, []uint64{3072}},
		{"vllm-packed-hnd", p, []Part{part("k", 8, 0, 0, 1024, 32, 512), part("v", 8, 0, 16, 1024, 32, 512)}, []uint64{3072}},
		// stored (3, 16, 2, 16): a token's heads side by side, each row K|V.
		{"vllm-packed-nhd", p, []Part{part("k", 8, 0, 0, 1024, 64, 32), part("v", 8, 0, 16, 1024, 64, 32)}, []uint64{3072}},
		// (3, 2, 2, 16, 8): per (block, head), 16 K rows of 16 bytes then 16 V rows.
		{"vllm-cpu", p, []Part{part("k", 8, 0, 0, 1024, 16, 512), part("v", 8, 0, 256, 1024, 16, 512)}, []uint64{3072}},
		{"ascend", p, []Part{part("k", 8, 0, 0, 512, 32, 16), part("v", 8, 1, 0, 512, 32, 16)}, []uint64{1536, 1536}},
		// (48, 2, 8) each.
		{"sglang", p, []Part{part("k", 8, 0, 0, 512, 32, 16), part("v", 8, 1, 0, 512, 32, 16)}, []uint64{1536, 1536}},
		// (3, 16, 576): a token is 1152 bytes.
		{"vllm-mla", mla, []Part{part("kv_c", 576, 0, 0, 18432, 1152, 0)}, []uint64{55296}},
		{"sglang-mla", mla, []Part{part("kv_c", 576, 0, 0, 18432, 1152, 1152)}, []uint64{55296}},
		{"ascend-mla", mla, []Part{part("latent", 512, 0, 0, 16384, 1024, 1024), part("rope", 64, 1, 0, 2048, 128, 128)}, []uint64{49152, 6144}},
	}
	seen := map[string]bool{}
	for _, c := range cases {
		seen[c.name] = true
		l, lens, err := Preset(c.name, c.p)
		if err != nil {
			t.Fatalf("Preset(%s): %v", c.name, err)
		}
		if !slices.Equal(l.Parts, c.parts) || !slices.Equal(lens, c.lens) {
			t.Errorf("Preset(%s):\n got parts %+v lens %v\nwant parts %+v lens %v", c.name, l.Parts, lens, c.parts, c.lens)
		}
		if l.Blocks != 3 || l.BlockSize != 16 {
			t.Errorf("Preset(%s): %d blocks of %d, want 3 of 16", c.name, l.Blocks, l.BlockSize)
		}
		if IsMLA(c.name) != (l.Heads == 1 && l.RowWidth() == 576) {
			t.Errorf("Preset(%s): IsMLA %v, heads %d width %d", c.name, IsMLA(c.name), l.Heads, l.RowWidth())
		}
	}
	for _, n := range Presets() {
		if !seen[n] {
			t.Errorf("preset %s has no shape case", n)
		}
	}
}

func TestPresetRefusals(t *testing.T) {
	ok := Params{DType: BF16, Blocks: 4, BlockSize: 16, Heads: 8, HeadSize: 128}
	with := func(f func(*Params)) Params { p := ok; f(&p); return p }
	cases := []struct {
		preset string
		p      Params
		want   string
	}{
		{"vllm-foo", ok, `preset "vllm-foo" unknown`},
		{"ascend", with(func(p *Params) { p.HeadSize = 0 }), "head_size 0"},
		{"ascend", with(func(p *Params) { p.HeadLo, p.HeadHi = 4, 9 }), "head slice [4, 9) not inside [0, 8)"},
		{"ascend", with(func(p *Params) { p.BlockSize = 0 }), "block_size 0"},
		{"ascend", with(func(p *Params) { p.DType = DTypeInvalid }), "dtype invalid unknown"},
		{"vllm-flash", with(func(p *Params) { p.Blocks, p.BlockSize = 1<<31, 1<<31 }), "above 2^62 elements"},
		{"vllm-mla", with(func(p *Params) {}), "heads 8"},
		{"vllm-mla", with(func(p *Params) { p.Heads, p.Widths = 1, []uint32{512} }), "1 widths; want 2"},
		{"ascend-mla", with(func(p *Params) { p.Heads, p.Widths = 1, []uint32{65535, 1} }), "row width 65536"},
	}
	for _, c := range cases {
		if _, _, err := Preset(c.preset, c.p); err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrInvalid) {
			t.Errorf("Preset(%s, %+v) = %v; want ErrInvalid naming %q", c.preset, c.p, err, c.want)
		}
	}
}

// validLayout is vllm-flash-like: 4 blocks of 16 tokens, heads [2, 4) of
// 8, head size 8, bf16, in a tensor of 4096 bytes.
func validLayout() (Layout, []uint64) {
	return Layout{DType: BF16, BlockSize: 16, Blocks: 4, Heads: 8, HeadLo: 2, HeadHi: 4, Parts: []Part{
		{Name: "k", Width: 8, Offset: 0, BlockStride: 512, SlotStride: 32, HeadStride: 16},
		{Name: "v", Width: 8, Offset: 2048, BlockStride: 512, SlotStride: 32, HeadStride: 16},
	}}, []uint64{4096}
}

// TestValidateRefusals breaks one rule at a time; each error must name the
// field, its value and the limit.
func TestValidateRefusals(t *testing.T) {
	cases := []struct {
		name string
		f    func(l *Layout, lens *[]uint64)
		want []string
	}{
		{"dtype", func(l *Layout, _ *[]uint64) { l.DType = 99 }, []string{"dtype", "dtype(99)", "unknown"}},
		{"block_size", func(l *Layout, _ *[]uint64) { l.BlockSize = 0 }, []string{"block_size 0", "minimum 1"}},
		{"blocks", func(l *Layout, _ *[]uint64) { l.Blocks = 0 }, []string{"blocks 0", "minimum 1"}},
		{"heads", func(l *Layout, _ *[]uint64) { l.Heads, l.HeadLo, l.HeadHi = 0, 0, 0 }, []string{"heads 0", "minimum 1"}},
		{"head_lo", func(l *Layout, _ *[]uint64) { l.HeadLo = 4 }, []string{"head_lo 4", "head_hi 4"}},
		{"head_hi", func(l *Layout, _ *[]uint64) { l.HeadHi = 9 }, []string{"head_hi 9", "heads 8"}},
		{"no parts", func(l *Layout, _ *[]uint64) { l.Parts = nil }, []string{"0 parts", "minimum 1"}},
		{"too many parts", func(l *Layout, _ *[]uint64) {
			for len(l.Parts) <= MaxParts {
				l.Parts = append(l.Parts, l.Parts[0])
			}
		}, []string{"9 parts", "limit 8"}},
		{"width", func(l *Layout, _ *[]uint64) { l.Parts[1].Width = 0 }, []string{"parts[1].width 0", "minimum 1"}},
		{"row width", func(l *Layout, _ *[]uint64) { l.Parts[0].Width, l.Parts[1].Width = 40000, 30000 }, []string{"row width 70000", "limit 65535"}},
		{"packed name", func(l *Layout, _ *[]uint64) { l.Parts[0].Name = "kv" }, []string{`parts[0].name "kv"`, "two parts"}},
		{"tensor index", func(l *Layout, _ *[]uint64) { l.Parts[1].Tensor = 1 }, []string{"parts[1].tensor 1", "1 tensor lengths"}},
		{"negative tensor", func(l *Layout, _ *[]uint64) { l.Parts[1].Tensor = -1 }, []string{"parts[1].tensor -1", "[0, 8)"}},
		{"too many tensors", func(_ *Layout, lens *[]uint64) { *lens = make([]uint64, 9) }, []string{"9 tensors", "limit 8"}},
		{"past the tensor", func(_ *Layout, lens *[]uint64) { (*lens)[0] = 4095 }, []string{"parts[1]", "byte 4096 of tensor 0", "holds 4095"}},
		{"past 2^64", func(l *Layout, _ *[]uint64) { l.Parts[0].BlockStride = 1 << 63 }, []string{"parts[0]", "2^64", "offset 0"}},
		{"rows overlap", func(l *Layout, _ *[]uint64) { l.Parts[0].SlotStride = 16 }, []string{"parts[0]", "rows overlap", "slot_stride 16 x 16", "head_stride 16 x 2"}},
		{"zero stride", func(l *Layout, _ *[]uint64) { l.Parts[0].HeadStride = 0 }, []string{"parts[0]", "rows overlap", "head_stride 0 x 2"}},
		{"parts overlap", func(l *Layout, _ *[]uint64) { l.Parts[1].Offset = 2040 }, []string{"parts[0]", "parts[1]", "overlap in tensor 0"}},
		{"interleaved parts", func(l *Layout, _ *[]uint64) { l.Parts[1].Offset = 8 }, []string{"parts[0]", "parts[1]", "overlap in tensor 0"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, lens := validLayout()
			if err := l.Validate(lens); err != nil {
				t.Fatalf("the valid layout: %v", err)
			}
			c.f(&l, &lens)
			err := l.Validate(lens)
			if err == nil || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate = %v; want ErrInvalid", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate = %q; want it to name %q", err, w)
				}
			}
		})
	}
}

// TestValidateAccepts covers layouts that are legal though no preset
// builds them: parts interleaved in one row, and a tensor with slack.
func TestValidateAccepts(t *testing.T) {
	l, lens := validLayout()
	l.Parts[1].Offset, l.Parts[0].HeadStride, l.Parts[1].HeadStride = 16, 32, 32
	l.Parts[0].SlotStride, l.Parts[1].SlotStride = 64, 64
	l.Parts[0].BlockStride, l.Parts[1].BlockStride = 1024, 1024
	if err := l.Validate(lens); err != nil {
		t.Errorf("K|V in one row, heads K|V K|V: %v", err)
	}
	l, lens = validLayout()
	lens[0] = 1 << 40
	if err := l.Validate(lens); err != nil {
		t.Errorf("slack after the rows: %v", err)
	}
}
