package staging

import (
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"

	"github.com/stage-kv/stage/device"
)

func TestMakePlan(t *testing.T) {
	tests := []struct {
		name       string
		ops        []PlanOp
		chunk      int
		wantChunks int
		wantSrc    []int // segments per chunk
		wantDst    []int
	}{
		{"one range split", []PlanOp{{Src: 1000, DstRegion: 0, DstOff: 0, Len: 10}}, 4, 3, []int{1, 1, 1}, []int{1, 1, 1}},
		{"contiguous ops merge", []PlanOp{{Src: 0, DstOff: 0, Len: 2}, {Src: 2, DstOff: 2, Len: 2}}, 8, 1, []int{1}, []int{1}},
		{"scattered src, contiguous dst", []PlanOp{{Src: 100, DstOff: 0, Len: 2}, {Src: 10, DstOff: 2, Len: 2}}, 8, 1, []int{2}, []int{1}},
		{"contiguous src, other region", []PlanOp{{Src: 0, DstRegion: 0, DstOff: 0, Len: 2}, {Src: 2, DstRegion: 1, DstOff: 2, Len: 2}}, 8, 1, []int{1}, []int{2}},
		{"blocks fill chunks", []PlanOp{{Src: 0, DstOff: 8, Len: 4}, {Src: 50, DstOff: 0, Len: 4}, {Src: 90, DstOff: 40, Len: 4}}, 8, 2, []int{2, 1}, []int{2, 1}},
		{"op straddles chunk", []PlanOp{{Src: 0, DstOff: 0, Len: 3}, {Src: 100, DstOff: 100, Len: 6}}, 4, 3, []int{2, 1, 1}, []int{2, 1, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := MakePlan(tc.ops, tc.chunk)
			if err != nil {
				t.Fatal(err)
			}
			if p.Len() != tc.wantChunks {
				t.Fatalf("got %d chunks, want %d", p.Len(), tc.wantChunks)
			}
			for i, c := range allChunks(p) {
				if len(c.Src) != tc.wantSrc[i] || len(c.Dst) != tc.wantDst[i] {
					t.Errorf("chunk %d: got %d src / %d dst segments, want %d / %d", i, len(c.Src), len(c.Dst), tc.wantSrc[i], tc.wantDst[i])
				}
			}
			checkPlan(t, tc.ops, p, tc.chunk)
		})
	}
}

// allChunks cuts and returns every chunk of p.
func allChunks(p *Plan) []Chunk {
	out := make([]Chunk, p.Len())
	for i := range out {
		out[i] = *p.Chunk(i)
	}
	return out
}

func TestMakePlanErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ops   []PlanOp
		chunk int
	}{
		{"empty", nil, 8},
		{"zero length op", []PlanOp{{Len: 0}}, 8},
		{"zero chunk", []PlanOp{{Len: 1}}, 0},
		{"chunk over 4 GiB", []PlanOp{{Len: 1}}, 1 << 32},
		{"overflow", []PlanOp{{Len: 1 << 63}, {Len: 1 << 63}}, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := MakePlan(tc.ops, tc.chunk); err == nil {
				t.Fatal("got nil error, want one")
			}
			if p, err := NewPlan(tc.ops, tc.chunk); p != nil || err == nil {
				t.Fatalf("NewPlan: got %v, %v; want nil and an error", p, err)
			}
		})
	}
}

// checkPlan replays a plan byte by byte and checks every source byte lands
// where its op says, with chunks no larger than chunk.
func checkPlan(t *testing.T, ops []PlanOp, p *Plan, chunk int) {
	t.Helper()
	type dst struct {
		region uint32
		off    uint64
	}
	want := map[device.Addr]dst{}
	var total uint64
	for _, op := range ops {
		for i := uint64(0); i < op.Len; i++ {
			want[op.Src+device.Addr(i)] = dst{op.DstRegion, op.DstOff + i}
		}
		total += op.Len
	}
	if p.Total != total {
		t.Fatalf("plan total %d, want %d", p.Total, total)
	}
	var seen uint64
	for ci, c := range allChunks(p) {
		if int(c.Len) > chunk || c.Len == 0 {
			t.Fatalf("chunk %d has %d B (chunk size %d)", ci, c.Len, chunk)
		}
		if c.Len != p.ChunkLen(ci) {
			t.Fatalf("chunk %d has %d B, ChunkLen says %d", ci, c.Len, p.ChunkLen(ci))
		}
		if ci < p.Len()-1 && (p.tail == nil || ci < p.head) && int(c.Len) != chunk {
			t.Fatalf("chunk %d of %d has %d B, want a full %d", ci, p.Len(), c.Len, chunk)
		}
		if cap(c.Src) != len(c.Src) || cap(c.Dst) != len(c.Dst) {
			t.Fatalf("chunk %d: segment lists have room past their end (%d/%d, %d/%d): appending would overwrite the next chunk", ci, len(c.Src), cap(c.Src), len(c.Dst), cap(c.Dst))
		}
		if device.SegsLen(c.Src) != uint64(c.Len) {
			t.Fatalf("chunk %d: src segments add to %d, want %d", ci, device.SegsLen(c.Src), c.Len)
		}
		var srcs []device.Addr
		for _, s := range c.Src {
			for i := uint64(0); i < s.Len; i++ {
				srcs = append(srcs, s.Addr+device.Addr(i))
			}
		}
		k := 0
		for _, d := range c.Dst {
			for i := uint64(0); i < uint64(d.Len); i++ {
				got := dst{d.Region, d.Off + i}
				if w := want[srcs[k]]; w != got {
					t.Fatalf("chunk %d byte %d: source %d lands at %v, want %v", ci, k, srcs[k], got, w)
				}
				k++
			}
		}
		if k != len(srcs) {
			t.Fatalf("chunk %d: %d destination bytes for %d source bytes", ci, k, len(srcs))
		}
		seen += uint64(c.Len)
	}
	if seen != total {
		t.Fatalf("chunks carry %d B, want %d", seen, total)
	}
}

func TestMakePlanRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 50; trial++ {
		n := 1 + r.IntN(40)
		var ops []PlanOp
		for i := 0; i < n; i++ {
			ops = append(ops, PlanOp{Src: device.Addr(r.IntN(1 << 20)), DstRegion: uint32(r.IntN(3)), DstOff: uint64(r.IntN(1 << 20)), Len: uint64(1 + r.IntN(100))})
		}
		// Sources must not overlap for the byte map to be a function.
		var addr device.Addr
		for i := range ops {
			ops[i].Src = addr + device.Addr(r.IntN(2)*7)
			addr = ops[i].Src + device.Addr(ops[i].Len)
		}
		chunk := 1 + r.IntN(300)
		p, err := MakePlan(ops, chunk)
		if err != nil {
			t.Fatal(err)
		}
		checkPlan(t, ops, p, chunk)
	}
}

// TestPlanCutsOnDemand: a plan cuts chunks only as far as asked, in order,
// cuts them as MakePlan does, and never moves or changes a chunk it
// returned, however many slabs the later chunks take.
func TestPlanCutsOnDemand(t *testing.T) {
	ops := scattered(3*slabSegs+77, 16)
	const chunk = 64 // 4 ops a chunk, many slabs
	p, err := NewPlan(ops, chunk)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.chunks) != 0 {
		t.Fatalf("NewPlan cut %d chunks, want none", len(p.chunks))
	}
	if got, want := p.Len(), (len(ops)+3)/4; got != want {
		t.Fatalf("got %d chunks, want %d", got, want)
	}
	first := p.Chunk(0)
	saved := Chunk{Len: first.Len, Src: append([]device.Seg(nil), first.Src...), Dst: append([]DstSeg(nil), first.Dst...)}
	if len(p.chunks) != 1 {
		t.Fatalf("Chunk(0) cut %d chunks, want 1", len(p.chunks))
	}
	mid := p.Chunk(p.Len() / 2)
	if len(p.chunks) != p.Len()/2+1 {
		t.Fatalf("Chunk(%d) cut %d chunks, want %d", p.Len()/2, len(p.chunks), p.Len()/2+1)
	}
	all := allChunks(p)
	if p.Chunk(0) != first || p.Chunk(p.Len()/2) != mid {
		t.Fatal("a chunk moved when later chunks were cut")
	}
	if !reflect.DeepEqual(*first, saved) {
		t.Fatalf("chunk 0 changed when later chunks were cut: got %+v, want %+v", *first, saved)
	}
	whole, err := MakePlan(ops, chunk)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(all, allChunks(whole)) {
		t.Fatal("chunks cut on demand differ from MakePlan's")
	}
	checkPlan(t, ops, p, chunk)
}

// TestPlanManyTinyOps crosses slab boundaries with ops that merge and
// ops that do not, byte for byte.
func TestPlanManyTinyOps(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ops := make([]PlanOp, 3*slabSegs)
	var addr device.Addr
	for i := range ops {
		n := uint64(1 + r.IntN(3))
		addr += device.Addr(r.IntN(2) * 5) // half continue the previous op
		ops[i] = PlanOp{Src: addr, DstRegion: uint32(r.IntN(2)), DstOff: uint64(r.IntN(1 << 30)), Len: n}
		addr += device.Addr(n)
	}
	for _, chunk := range []int{1, 7, 4096, 1 << 20} {
		p, err := NewPlan(ops, chunk)
		if err != nil {
			t.Fatal(err)
		}
		checkPlan(t, ops, p, chunk)
	}
}

// scattered is n blocks of size block, both sides in a random order.
func scattered(n int, block uint64) []PlanOp {
	ops := make([]PlanOp, n)
	r := rand.New(rand.NewPCG(1, 2))
	perm := r.Perm(n)
	for i := range ops {
		ops[i] = PlanOp{Src: device.Addr(uint64(perm[i]) * block), DstOff: uint64(i) * block, Len: block}
	}
	return ops
}

// BenchmarkPlanFirstChunk65536Blocks is what planning adds before the
// first chunk of a push of 65,536 scattered 16 KiB blocks can move.
func BenchmarkPlanFirstChunk65536Blocks(b *testing.B) {
	ops := scattered(65536, 16<<10)
	b.ReportAllocs()
	for b.Loop() {
		p, err := NewPlan(ops, 4<<20)
		if err != nil {
			b.Fatal(err)
		}
		p.Chunk(0)
	}
}

// BenchmarkMakePlan65536Blocks cuts every chunk of that push.
func BenchmarkMakePlan65536Blocks(b *testing.B) {
	ops := scattered(65536, 16<<10)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := MakePlan(ops, 4<<20); err != nil {
			b.Fatal(err)
		}
	}
}

// A mapped plan cuts its stream into chunks of the chunk size, asks gather
// for exactly each chunk's bytes, and addresses each chunk's destination by
// its stream offset.
func TestMappedPlan(t *testing.T) {
	for _, tt := range []struct {
		name         string
		total        uint64
		chunk, piece int
	}{
		{"one short chunk", 100, 4096, 10},
		{"exact chunks", 3 * 4096, 4096, 256},
		{"pieces across chunks", 10000, 4096, 300},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var asked uint64
			var mu sync.Mutex
			// Pieces of the stream come from addresses in reverse order:
			// piece k lives at 1<<20 - (k+1)*piece.
			gather := func(off uint64, n uint32, segs []device.Seg) []device.Seg {
				mu.Lock()
				asked += uint64(n)
				mu.Unlock()
				for end := off + uint64(n); off < end; {
					k := off / uint64(tt.piece)
					in := off % uint64(tt.piece)
					m := min(uint64(tt.piece)-in, end-off)
					segs = append(segs, device.Seg{Addr: device.Addr(1<<20 - (k+1)*uint64(tt.piece) + in), Len: m})
					off += m
				}
				return segs
			}
			p, err := NewMappedPlan(tt.total, tt.chunk, 77, gather)
			if err != nil {
				t.Fatal(err)
			}
			want := int((tt.total + uint64(tt.chunk) - 1) / uint64(tt.chunk))
			if p.Len() != want {
				t.Fatalf("%d chunks, want %d", p.Len(), want)
			}
			var off uint64
			for i := 0; i < p.Len(); i++ {
				c := p.Chunk(i)
				if !c.Mapped() || c.Src != nil || c.Off != off {
					t.Fatalf("chunk %d: mapped %v, Src %v, Off %d; want mapped at %d", i, c.Mapped(), c.Src, c.Off, off)
				}
				if src := c.Sources(nil); c.Len != p.ChunkLen(i) || device.SegsLen(src) != uint64(c.Len) {
					t.Fatalf("chunk %d: Len %d, ChunkLen %d, sources %d B", i, c.Len, p.ChunkLen(i), device.SegsLen(src))
				}
				if len(c.Dst) != 1 || c.Dst[0] != (DstSeg{Region: 77, Len: c.Len, Off: off}) {
					t.Fatalf("chunk %d: destination %+v, want one segment of region 77 at %d", i, c.Dst, off)
				}
				off += uint64(c.Len)
			}
			if off != tt.total || asked != tt.total {
				t.Fatalf("chunks cover %d B, gather asked for %d, want %d", off, asked, tt.total)
			}
		})
	}
	if _, err := NewMappedPlan(0, 4096, 0, nil); err == nil {
		t.Fatal("an empty mapped plan was accepted")
	}
}

// TestMappedRunPlan: a mapped plan with a RunFunc hands each chunk's own
// stream range to it, and one without has no runs.
func TestMappedRunPlan(t *testing.T) {
	runs := func(off uint64, n uint32, rs []device.Run) []device.Run {
		return append(rs, device.Run{Addr: device.Addr(off), Len: n, N1: 1, N2: 1})
	}
	segs := func(uint64, uint32, []device.Seg) []device.Seg { return nil }
	p, err := NewMappedRunPlan(10000, 4096, 5, segs, runs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range p.Len() {
		c := p.Chunk(i)
		got := c.SourceRuns(nil)
		if !c.HasRuns() || len(got) != 1 || uint64(got[0].Addr) != uint64(i)*4096 || got[0].Len != p.ChunkLen(i) {
			t.Fatalf("chunk %d: runs %v (has %v), want one at %d of %d B", i, got, c.HasRuns(), i*4096, p.ChunkLen(i))
		}
	}
	q, err := NewMappedPlan(100, 4096, 5, segs)
	if err != nil {
		t.Fatal(err)
	}
	if q.Chunk(0).HasRuns() {
		t.Fatal("a plan without a RunFunc says its chunks have runs")
	}
}
