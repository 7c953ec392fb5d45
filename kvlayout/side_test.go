package kvlayout

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

type seg struct {
	layer, region int
	off           uint64
	n             uint32
	wire          uint64
}

// collect gathers the segments of [off, off+n) and checks that their
// wire offsets are contiguous from off and their lengths sum to n.
func collect(t testing.TB, s *Side, off, n uint64) []seg {
	t.Helper()
	var out []seg
	next := off
	s.Segments(off, n, func(layer, region int, toff uint64, length uint32, wire uint64) {
		if wire != next || length == 0 {
			t.Fatalf("segment at wire %d (+%d), want wire %d and a nonzero length", wire, length, next)
		}
		next += uint64(length)
		out = append(out, seg{layer, region, toff, length, wire})
	})
	if next != off+n {
		t.Fatalf("segments of [%d, +%d) end at %d", off, n, next)
	}
	return out
}

func newSide(t testing.TB, spec SideSpec) *Side {
	t.Helper()
	s, err := NewSide(spec)
	if err != nil {
		t.Fatalf("NewSide: %v", err)
	}
	return s
}

// TestCoalescing counts segments: contiguous memory must come out as one
// segment, and only as fine as the layout forces.
func TestCoalescing(t *testing.T) {
	p := Params{DType: BF16, Blocks: 16, BlockSize: 16, Heads: 8, HeadSize: 64}
	table := []uint32{3, 4, 5, 9, 1, 2} // runs {3,4,5} {9} {1,2}
	const runs, layers = 3, 2
	regions := [][]int{{0, 1}, {2, 3}}
	one := [][]int{{0}, {1}}
	mla := Params{DType: BF16, Blocks: 16, BlockSize: 16}
	cases := []struct {
		name    string
		preset  string
		p       Params
		peer    string // the other side, for the columns
		first   uint64
		tokens  uint64
		lo, hi  uint32
		regions [][]int
		perCol  []int // segments per layer, per column
		order   Order
		merged  bool // both sides' layouts Merged
	}{
		{"ascend, all heads, whole blocks", "ascend", p, "ascend", 0, 96, 0, 8, regions, []int{runs, runs}, TokenMajor, false},
		{"ascend, cut first and last block", "ascend", p, "ascend", 5, 80, 0, 8, regions, []int{runs, runs}, TokenMajor, false},
		{"vllm-flash, all heads", "vllm-flash", p, "ascend", 0, 96, 0, 8, one, []int{runs, runs}, TokenMajor, false},
		{"sglang, all heads", "sglang", p, "vllm-flash", 0, 96, 0, 8, regions, []int{runs, runs}, TokenMajor, false},
		{"ascend, half the heads: one per token", "ascend", p, "ascend", 0, 96, 4, 8, regions, []int{96, 96}, TokenMajor, false},
		// The last row of a block (head 7, slot 15) ends where the next
		// block id's first row (head 0, slot 0) starts: 3 merges.
		{"vllm-hnd, 8 heads: one per row", "vllm-hnd", p, "ascend", 0, 96, 0, 8, one, []int{96*8 - 3, 96*8 - 3}, TokenMajor, false},
		{"vllm-hnd, 1 head: one per block", "vllm-hnd", p, "ascend", 0, 96, 3, 4, one, []int{6, 6}, TokenMajor, false},
		{"vllm-packed, 1 head: one per token", "vllm-packed", p, "ascend", 0, 96, 3, 4, one, []int{96, 96}, TokenMajor, false},
		{"vllm-flashinfer, all heads: one per block", "vllm-flashinfer", p, "ascend", 0, 96, 0, 8, one, []int{6, 6}, TokenMajor, false},
		{"ascend-mla against itself", "ascend-mla", mla, "ascend-mla", 0, 96, 0, 1, regions, []int{runs, runs}, TokenMajor, false},
		{"vllm-mla against itself", "vllm-mla", mla, "vllm-mla", 0, 96, 0, 1, one, []int{runs}, TokenMajor, false},
		{"vllm-mla against ascend-mla: one per token", "vllm-mla", mla, "ascend-mla", 0, 96, 0, 1, one, []int{96, 96}, TokenMajor, false},
		{"ascend-mla against vllm-mla", "ascend-mla", mla, "vllm-mla", 0, 96, 0, 1, regions, []int{runs, runs}, TokenMajor, false},
		// Block-major: a head's tokens, then the block's heads, lie
		// together: one segment per block run, as identical NHD layouts.
		{"vllm-hnd block-major against itself", "vllm-hnd", p, "vllm-hnd", 0, 96, 0, 8, one, []int{runs, runs}, BlockMajor, false},
		// A cut block is one segment per head: its first block's 8 (the
		// last joins blocks 4 and 5), block 9, block 1 with the first head
		// of the cut block 2, and block 2's other 7 heads.
		{"vllm-hnd block-major, cut first and last block", "vllm-hnd", p, "vllm-hnd", 5, 80, 0, 8, one, []int{8 + 1 + 1 + 7, 8 + 1 + 1 + 7}, BlockMajor, false},
		// Heads 2 and 3 lie together in a block, apart from the next block's.
		{"vllm-hnd block-major, 2 of 8 heads: one per block", "vllm-hnd", p, "vllm-hnd", 0, 96, 2, 4, one, []int{6, 6}, BlockMajor, false},
		// Packed K|V merged is one column, whole blocks; unmerged, two
		// columns of rows apart.
		{"vllm-packed merged, block-major", "vllm-packed", p, "vllm-packed", 0, 96, 0, 8, one, []int{runs}, BlockMajor, true},
		{"vllm-packed unmerged, block-major: one per row", "vllm-packed", p, "vllm-packed", 0, 96, 0, 8, one, []int{96 * 8, 96 * 8}, BlockMajor, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, peer := mustPreset(t, c.preset, c.p), mustPreset(t, c.peer, c.p)
			if c.merged {
				l, peer = l.Merged(), peer.Merged()
			}
			cols := Columns(l, peer)
			s := newSide(t, SideSpec{Layout: l, Regions: c.regions, Table: table, FirstToken: c.first, Tokens: c.tokens, HeadLo: c.lo, HeadHi: c.hi, Cols: cols, Order: c.order})
			want := 0
			for _, n := range c.perCol {
				want += n * layers
			}
			if got := len(collect(t, s, 0, s.Len())); got != want {
				t.Errorf("%d segments, want %d", got, want)
			}
			// Cut in chunks, a chunk boundary adds at most one segment.
			chunks := 0
			for off := uint64(0); off < s.Len(); off += 4099 {
				chunks += len(collect(t, s, off, min(4099, s.Len()-off)))
			}
			if n := int((s.Len() + 4098) / 4099); chunks > want+n-1 || chunks < want {
				t.Errorf("%d segments in %d chunks, want %d to %d", chunks, n, want, want+n-1)
			}
		})
	}
}

// TestNewSideRefusals: each check of NewSide refuses naming the values.
func TestNewSideRefusals(t *testing.T) {
	l := mustPreset(t, "ascend", Params{DType: BF16, Blocks: 8, BlockSize: 16, Heads: 8, HeadLo: 2, HeadHi: 6, HeadSize: 64})
	ok := SideSpec{Layout: l, Regions: [][]int{{0, 1}}, Table: []uint32{7, 0, 3}, FirstToken: 4, Tokens: 40, HeadLo: 2, HeadHi: 6, Cols: Columns(l, l)}
	if _, err := NewSide(ok); err != nil {
		t.Fatalf("the valid side: %v", err)
	}
	cases := []struct {
		name string
		f    func(s *SideSpec)
		want string
	}{
		{"block id", func(s *SideSpec) { s.Table = []uint32{7, 8, 3} }, "block_table[1] = 8, outside the layout's 8 blocks"},
		{"tokens past the table", func(s *SideSpec) { s.Tokens = 45 }, "first_token 4 + tokens 45 exceeds the block table's 3 blocks x 16 tokens = 48"},
		{"first token past the table", func(s *SideSpec) { s.FirstToken = 48; s.Tokens = 1 }, "first_token 48 + tokens 1 exceeds"},
		{"token overflow", func(s *SideSpec) { s.FirstToken = ^uint64(0) }, "exceeds the block table"},
		{"no tokens", func(s *SideSpec) { s.Tokens = 0 }, "tokens 0 below the minimum 1"},
		{"heads below the slice", func(s *SideSpec) { s.HeadLo = 1 }, "transfer heads [1, 6) outside this side's slice [2, 6)"},
		{"heads above the slice", func(s *SideSpec) { s.HeadHi = 7 }, "transfer heads [2, 7) outside this side's slice [2, 6)"},
		{"no heads", func(s *SideSpec) { s.HeadLo = 6 }, "transfer heads [6, 6) empty"},
		{"no layers", func(s *SideSpec) { s.Regions = nil }, "0 layers"},
		{"regions per layer", func(s *SideSpec) { s.Regions = [][]int{{0}} }, "layer 0 names 1 regions, the layout has 2 tensors"},
		{"negative region", func(s *SideSpec) { s.Regions = [][]int{{0, -1}} }, "layer 0 tensor 1: region -1"},
		{"no columns", func(s *SideSpec) { s.Cols = nil }, "0 columns"},
		{"gap in columns", func(s *SideSpec) { s.Cols = []Col{{0, 64}, {65, 128}} }, "cols[1] = [65, 128); want a nonempty range starting at 64"},
		{"column across parts", func(s *SideSpec) { s.Cols = []Col{{0, 100}, {100, 128}} }, "cols[0] = [0, 100) crosses a part boundary"},
		{"columns short", func(s *SideSpec) { s.Cols = []Col{{0, 64}} }, "columns end at 64, the row is 128 wide"},
		{"columns past the row", func(s *SideSpec) { s.Cols = []Col{{0, 64}, {64, 128}, {128, 130}} }, "cols[2] = [128, 130) crosses a part boundary of this side (or the row's end, 128)"},
		{"layout", func(s *SideSpec) { s.Layout.BlockSize = 0 }, "block_size 0"},
		{"repeated destination block", func(s *SideSpec) { s.Written, s.Table = true, []uint32{7, 0, 7} },
			"block_table[0] and block_table[2] are both block 7; a destination's blocks must differ (tokens [4, 44) use entries 0 to 2)"},
	}
	for _, c := range cases {
		spec := ok
		c.f(&spec)
		if _, err := NewSide(spec); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: NewSide = %v; want ErrInvalid naming %q", c.name, err, c.want)
		}
	}
}

// TestCheckDistinct: a destination's used blocks must differ; the
// refusal names the id and its first two positions, whichever way the ids
// are checked (bitmap, or sort for sparse ids); a source may repeat.
func TestCheckDistinct(t *testing.T) {
	big := make([]uint32, 65536)
	for i := range big {
		big[i] = uint32(len(big) - 1 - i)
	}
	bigRepeat := slices.Clone(big)
	bigRepeat[65535] = bigRepeat[3]
	sparse := func(ids ...uint32) []uint32 { // ids far apart: the sort path
		for i := range ids {
			ids[i] = ids[i]<<24 | 5
		}
		return ids
	}
	cases := []struct {
		name          string
		table         []uint32
		bs            uint32
		first, tokens uint64
		want          string // "" accepted
	}{
		{"distinct", []uint32{3, 1, 2}, 16, 0, 48, ""},
		{"two tokens, one block", []uint32{2, 2}, 16, 0, 32, "block_table[0] and block_table[1] are both block 2"},
		{"repeat outside the tokens' blocks", []uint32{2, 4, 2, 9}, 16, 20, 20, ""},
		{"repeat inside, the first block partly used", []uint32{5, 2, 4, 2}, 16, 30, 20, "block_table[1] and block_table[3] are both block 2"},
		{"earliest repeat named", []uint32{1, 2, 3, 3, 2, 1}, 1, 0, 6, "block_table[2] and block_table[3] are both block 3"},
		{"one token", []uint32{8, 8}, 16, 16, 1, ""},
		{"sparse ids", sparse(9, 1, 2, 3, 4), 1, 0, 5, ""},
		{"sparse ids, a repeat", sparse(9, 1, 2, 1, 2), 1, 0, 5, "block_table[1] and block_table[3] are both block 16777221"},
		{"largest id", []uint32{^uint32(0), 0, ^uint32(0)}, 4, 0, 12, "block_table[0] and block_table[2] are both block 4294967295"},
		{"65536 blocks", big, 16, 0, 65536 * 16, ""},
		{"65536 blocks, the last repeats", bigRepeat, 16, 0, 65536 * 16, "block_table[3] and block_table[65535] are both block 65532"},
		{"tokens past the table", []uint32{1, 2}, 16, 20, 20, "tokens [20, 40) outside a block table of 2 blocks x 16 tokens"},
		{"block size 0", []uint32{1, 2}, 0, 0, 1, "outside a block table"},
	}
	for _, c := range cases {
		err := CheckDistinct(c.table, c.bs, c.first, c.tokens)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v; want it accepted", c.name, err)
		case c.want != "" && (err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v; want ErrInvalid naming %q", c.name, err, c.want)
		case strings.Contains(c.want, "both block") && !errors.Is(err, ErrRepeatedBlock):
			t.Errorf("%s: %v; want ErrRepeatedBlock", c.name, err)
		}
	}
	// NewSide checks a Written side only.
	l := mustPreset(t, "ascend", Params{DType: BF16, Blocks: 8, BlockSize: 16, Heads: 2, HeadSize: 8})
	spec := SideSpec{Layout: l, Regions: [][]int{{0, 1}}, Table: []uint32{3, 3}, Tokens: 32, HeadLo: 0, HeadHi: 2, Cols: Columns(l, l)}
	if _, err := NewSide(spec); err != nil {
		t.Errorf("a source naming block 3 twice: %v; want it accepted", err)
	}
	spec.Written = true
	if _, err := NewSide(spec); !errors.Is(err, ErrRepeatedBlock) {
		t.Errorf("a destination naming block 3 twice: %v; want ErrRepeatedBlock", err)
	}
}

func TestGatherScatterBounds(t *testing.T) {
	l, lens, err := Preset("ascend", Params{DType: BF16, Blocks: 4, BlockSize: 16, Heads: 2, HeadSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	s := newSide(t, SideSpec{Layout: l, Regions: [][]int{{0, 1}}, Table: []uint32{2, 3}, Tokens: 20, HeadLo: 0, HeadHi: 2, Cols: Columns(l, l)})
	ts := [][]byte{make([]byte, lens[0]), make([]byte, lens[1])}
	if s.Len() != 20*2*16*2 {
		t.Fatalf("Len = %d, want %d", s.Len(), 20*2*16*2)
	}
	cases := []struct {
		name    string
		tensors [][]byte
		off     uint64
		n       int
		want    string
	}{
		{"past the end", ts, s.Len() - 10, 11, "outside the transfer's 1280 bytes"},
		{"offset past the end", ts, s.Len() + 1, 0, "outside the transfer's 1280 bytes"},
		{"missing region", ts[:1], 0, int(s.Len()), "region 1, but 1 tensors given"},
		{"short region", [][]byte{ts[0][:100], ts[1]}, 0, 64, "[1024, +64) outside region 0's 100 bytes"},
	}
	for _, c := range cases {
		buf := make([]byte, c.n)
		if err := Gather(s, c.tensors, c.off, buf); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Gather = %v; want %q", c.name, err, c.want)
		}
		if err := Scatter(s, c.tensors, c.off, buf); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Scatter = %v; want %q", c.name, err, c.want)
		}
	}
	if err := Gather(s, ts, s.Len(), nil); err != nil {
		t.Errorf("empty gather at the end: %v", err)
	}
}
