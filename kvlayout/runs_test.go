package kvlayout

import (
	"math/rand"
	"reflect"
	"testing"
)

// piece is a contiguous range of one region, as a walk produces it.
type piece struct {
	layer, region int
	off, n, wire  uint64
}

// appendMerged appends p, joining it to the last piece when it continues
// it in the region and in the stream.
func appendMerged(ps []piece, p piece) []piece {
	if k := len(ps) - 1; k >= 0 && ps[k].layer == p.layer && ps[k].region == p.region &&
		ps[k].off+ps[k].n == p.off && ps[k].wire+ps[k].n == p.wire {
		ps[k].n += p.n
		return ps
	}
	return append(ps, p)
}

func segmentPieces(s *Side, off, n uint64) []piece {
	var ps []piece
	s.Segments(off, n, func(layer, region int, toff uint64, length uint32, wire uint64) {
		ps = appendMerged(ps, piece{layer, region, toff, uint64(length), wire})
	})
	return ps
}

// runPieces expands Runs' output piece by piece, checking each run's
// shape (nonzero, strides 0 on a dimension of one) and that its wire
// offsets continue the previous run's.
func runPieces(t *testing.T, s *Side, off, n uint64) (ps []piece, runs int) {
	t.Helper()
	next := off
	s.Runs(off, n, func(layer, region int, toff uint64, p, n1 uint32, s1 uint64, n2 uint32, s2 uint64, wire uint64) {
		runs++
		if p == 0 || n1 == 0 || n2 == 0 || (n1 == 1 && s1 != 0) || (n2 == 1 && s2 != 0) || wire != next {
			t.Fatalf("run at wire %d (want %d): piece %d, %d x %d, strides %d, %d", wire, next, p, n1, n2, s1, s2)
		}
		for i2 := range uint64(n2) {
			for i1 := range uint64(n1) {
				ps = appendMerged(ps, piece{layer, region, toff + i2*s2 + i1*s1, uint64(p), next})
				next += uint64(p)
			}
		}
	})
	return ps, runs
}

// checkRuns fails unless Runs and Segments cover the same bytes of [off,
// off+n) in the same order.
func checkRuns(t *testing.T, s *Side, off, n uint64) {
	t.Helper()
	got, _ := runPieces(t, s, off, n)
	want := segmentPieces(s, off, n)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%v: Runs(%d, %d) expands to %d pieces, Segments gives %d:\n runs %v\n segs %v", s, off, n, len(got), len(want), head(got), head(want))
	}
}

func head(ps []piece) []piece { return ps[:min(len(ps), 8)] }

// TestRunsMatchSegments: random sides of every preset pair, both orders,
// cut at random points (inside pieces, tokens and blocks), give the same
// bytes through Runs as through Segments.
func TestRunsMatchSegments(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	for i := range 400 {
		data := make([]byte, 64)
		rng.Read(data)
		b := fuzzBytes(data)
		s, _ := fuzzSide(t, &b, Order(i%2))
		for off := uint64(0); off < s.Len(); {
			n := 1 + uint64(rng.Intn(int(min(s.Len(), 1<<16))))
			if i%3 == 0 {
				n = 1 + uint64(rng.Intn(7))
			}
			checkRuns(t, s, off, n)
			off += n
		}
		checkRuns(t, s, 0, s.Len())
		checkRuns(t, s, s.Len()-1, 1<<40)
	}
}

// TestRunsHND: a 4 MiB chunk of an HND side (16-token blocks, 8 heads of
// 256 bytes, heads apart) is one run per block: 128 of them, each 8 heads
// by 16 tokens, where Segments gives 16,384.
func TestRunsHND(t *testing.T) {
	s := benchSide(t, "vllm-hnd", "ascend", 16)
	var runs int
	s.Runs(benchChunk, benchChunk, func(_, _ int, _ uint64, p, n1 uint32, s1 uint64, n2 uint32, s2 uint64, _ uint64) {
		runs++
		if p != 256 || n1 != 8 || n2 != 16 || s1 != 16*256 || s2 != 256 {
			t.Fatalf("run %d: piece %d, %d x %d, strides %d, %d; want 256, 8 x 16, 4096, 256", runs, p, n1, n2, s1, s2)
		}
	})
	if runs != 128 {
		t.Errorf("%d runs, want 128", runs)
	}
	checkRuns(t, s, benchChunk, benchChunk)
}

// FuzzRuns: Runs and Segments agree on random sides, orders and cuts.
func FuzzRuns(f *testing.F) {
	f.Add([]byte{0, 0, 1, 16, 4, 2, 8, 1, 0, 0, 10, 0, 7, 0})
	f.Add([]byte{1, 4, 2, 128, 8, 4, 64, 3, 1, 3, 200, 1, 77, 1, 0xff, 0xff})
	f.Add([]byte{0, 2, 0, 16, 7, 0, 100, 2, 1, 3, 3, 1, 9, 0, 0, 5, 1, 3, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		b := fuzzBytes(data)
		s, _ := fuzzSide(t, &b, Order(b.u8()%2))
		for off := uint64(0); off < s.Len(); {
			n := 1 + uint64(b.u16())
			if b.u8()%4 == 0 {
				n = 1 + uint64(b.u8()%7)
			}
			checkRuns(t, s, off, n)
			off += n
		}
		checkRuns(t, s, s.Len()-1, 1<<40)
	})
}

// TestRunsMLASplit: a vllm-mla side (576-wide rows) moving to a peer that
// keeps latent (512) and rope (64) apart gives each column one run per
// block's tokens (16 tokens a row apart), not a segment per token.
func TestRunsMLASplit(t *testing.T) {
	s := benchSide(t, "vllm-mla", "ascend-mla", 16)
	var runs, strided int
	s.Runs(benchChunk, benchChunk, func(_, _ int, _ uint64, p, n1 uint32, s1 uint64, n2 uint32, s2 uint64, _ uint64) {
		runs++
		if n2 > 1 {
			strided++
			if n1 != 1 || s2 != 1152 || (p != 1024 && p != 128) {
				t.Fatalf("run %d: piece %d, %d x %d, strides %d, %d; want 1024 or 128 B pieces, 1 x n, row stride 1152", runs, p, n1, n2, s1, s2)
			}
		}
	})
	// 4 MiB of 1,152-byte rows cut by columns: about 3,641 tokens in
	// 16-token blocks, twice (latent, rope), plus the cut ends.
	if runs > 2*(4<<20)/(16*1152)+8 || strided < runs-8 {
		t.Errorf("%d runs (%d strided), want about %d, nearly all strided", runs, strided, 2*(4<<20)/(16*1152))
	}
	checkRuns(t, s, benchChunk, benchChunk)
}
