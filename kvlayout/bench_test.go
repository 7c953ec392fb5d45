package kvlayout

import (
	"math/rand"
	"testing"
)

const benchChunk = 4 << 20

// benchSide is a side of 8 layers, heads [0, 8) of 8, head size 128, bf16,
// over a random table of 512 distinct blocks out of 4096, moving every
// token of the table.
func benchSide(b testing.TB, name, peer string, bs uint32) *Side {
	p := Params{DType: BF16, Blocks: 4096, BlockSize: bs, Heads: 8, HeadSize: 128}
	if IsMLA(name) {
		p.Heads, p.HeadSize = 1, 0
	}
	l := mustPreset(b, name, p)
	r := rand.New(rand.NewSource(1))
	perm := r.Perm(int(p.Blocks))
	table := make([]uint32, 512)
	for i := range table {
		table[i] = uint32(perm[i])
	}
	regions := make([][]int, 8)
	for i := range regions {
		for t := range l.NumTensors() {
			regions[i] = append(regions[i], i*l.NumTensors()+t)
		}
	}
	s, err := NewSide(SideSpec{Layout: l, Regions: regions, Table: table, Tokens: uint64(len(table)) * uint64(bs),
		HeadLo: 0, HeadHi: l.HeadHi, Cols: Columns(l, mustPreset(b, peer, p))})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkSegments maps 4 MiB chunks of the canonical stream, walking the
// whole transfer chunk by chunk; segs/chunk is the number of segments one
// chunk gives (what a copy engine or kernel must move).
func BenchmarkSegments(b *testing.B) {
	cases := []struct {
		name, side, peer string
		bs               uint32
	}{
		{"identical-nhd/ascend-bs128", "ascend", "ascend", 128},
		{"identical-nhd/vllm-flash-bs16", "vllm-flash", "vllm-flash", 16},
		{"nhd-to-hnd/vllm-hnd-bs16-256B-rows", "vllm-hnd", "ascend", 16},
		{"nhd-to-packed/vllm-packed-bs16", "vllm-packed", "ascend", 16},
		{"mla/vllm-mla-576-vs-512+64", "vllm-mla", "ascend-mla", 16},
		{"mla/ascend-mla-512+64-vs-576", "ascend-mla", "vllm-mla", 128},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			s := benchSide(b, c.side, c.peer, c.bs)
			var segs int
			emit := func(layer, region int, toff uint64, length uint32, wire uint64) { segs++ }
			chunks := benchChunks(b, s, func(off uint64) { s.Segments(off, benchChunk, emit) })
			b.ReportMetric(float64(segs)/float64(chunks), "segs/chunk")
		})
	}
}

// BenchmarkNewSide65536 is the work of accepting a 65,536-block request on
// one side: checking the layout, the regions, the columns and every block
// id, and preparing the mapping.
func BenchmarkNewSide65536(b *testing.B) {
	p := Params{DType: BF16, Blocks: 1 << 17, BlockSize: 16, Heads: 8, HeadSize: 128}
	src := mustPreset(b, "ascend", p)
	dst := mustPreset(b, "vllm-hnd", p)
	perm := rand.New(rand.NewSource(1)).Perm(int(p.Blocks))
	table := make([]uint32, 1<<16)
	for i := range table {
		table[i] = uint32(perm[i])
	}
	regions := make([][]int, 32)
	for i := range regions {
		regions[i] = []int{2 * i, 2*i + 1}
	}
	cols := Columns(src, dst)
	b.ReportAllocs()
	for b.Loop() {
		if err := Check(src, dst); err != nil {
			b.Fatal(err)
		}
		if _, err := NewSide(SideSpec{Layout: src, Regions: regions, Table: table, Tokens: 1 << 20, HeadLo: 0, HeadHi: 8, Cols: cols}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRuns is BenchmarkSegments' HND and contiguous cases through
// Runs: runs/chunk is what a strided kernel gets per 4 MiB chunk.
func BenchmarkRuns(b *testing.B) {
	for _, c := range []struct {
		name, side, peer string
		bs               uint32
	}{
		{"identical-nhd/ascend-bs128", "ascend", "ascend", 128},
		{"nhd-to-hnd/vllm-hnd-bs16-256B-rows", "vllm-hnd", "ascend", 16},
		{"mla/vllm-mla-576-vs-512+64", "vllm-mla", "ascend-mla", 16},
		{"mla/ascend-mla-512+64-vs-576", "ascend-mla", "vllm-mla", 128},
		{"mla/identical-vllm-mla", "vllm-mla", "vllm-mla", 16},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := benchSide(b, c.side, c.peer, c.bs)
			var runs int
			emit := func(int, int, uint64, uint32, uint32, uint64, uint32, uint64, uint64) { runs++ }
			chunks := benchChunks(b, s, func(off uint64) { s.Runs(off, benchChunk, emit) })
			b.ReportMetric(float64(runs)/float64(chunks), "runs/chunk")
		})
	}
}

// benchChunks maps 4 MiB chunks with walk in the benchmark loop, round
// the whole transfer, and returns how many it mapped.
func benchChunks(b *testing.B, s *Side, walk func(off uint64)) int {
	b.SetBytes(benchChunk)
	b.ReportAllocs()
	chunks, off := 0, uint64(0)
	for b.Loop() {
		if off >= s.Len() {
			off = 0
		}
		walk(off)
		off += benchChunk
		chunks++
	}
	return chunks
}
