package staging

import (
	"slices"
	"testing"

	"github.com/stage-kv/stage/device"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

// rep is n copies of v.
func rep(n int, v uint32) []uint32 { return slices.Repeat([]uint32{v}, n) }

// tailCase is a case of TestTailSizes: tailSizes' arguments, and what it
// should return (nil: the plain cut) with how many whole chunks before it.
type tailCase struct {
	name                string
	total, cs, minChunk uint64
	streams             int
	want                []uint32
	wantHeadChunks      uint64
	wantNilUnchange     bool
}

func TestTailSizes(t *testing.T) {
	for _, tc := range []tailCase{
		{name: "one stream", total: 64 * mib, cs: 4 * mib, streams: 1, minChunk: 256 * kib, wantNilUnchange: true},
		{name: "off", total: 64 * mib, cs: 4 * mib, streams: 8, minChunk: 0, wantNilUnchange: true},
		{name: "smallest above half a chunk", total: 64 * mib, cs: 4 * mib, streams: 8, minChunk: 3 * mib, wantNilUnchange: true},
		{name: "too little for a round", total: 1 * mib, cs: 4 * mib, streams: 8, minChunk: 256 * kib, wantNilUnchange: true},
		{
			// The bench's 1 GiB over 8 streams of 4 MiB chunks: the last 32
			// MiB in rounds of 2 MiB, 1 MiB, 512 KiB, 256 KiB and 2 MiB in front.
			name: "1 GiB, 8 streams", total: 1 << 30, cs: 4 * mib, streams: 8, minChunk: 256 * kib,
			want:           slices.Concat([]uint32{2 * mib}, rep(8, 2*mib), rep(8, mib), rep(8, 512*kib), rep(8, 256*kib)),
			wantHeadChunks: 248,
		},
		{
			name: "short transfer, two streams", total: 3 * mib, cs: 4 * mib, streams: 2, minChunk: 256 * kib,
			want: []uint32{768 * kib, 768 * kib, 512 * kib, 512 * kib, 256 * kib, 256 * kib},
		},
		{
			// What is left in front is cut in equal chunks, to a byte.
			name: "odd total", total: 10*mib + 5, cs: 4 * mib, streams: 2, minChunk: mib,
			want: []uint32{2*mib + 3, 2*mib + 2, 2 * mib, 2 * mib, mib, mib},
		},
		{
			// Rounds stop below the chunk size: a round of full chunks is the plain cut.
			name: "rounds up to half a chunk", total: 100 * mib, cs: 4 * mib, streams: 2, minChunk: 2 * mib,
			want:           []uint32{4 * mib, 2 * mib, 2 * mib},
			wantHeadChunks: 23,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tailSizes(tc.total, tc.cs, tc.streams, tc.minChunk)
			if tc.wantNilUnchange {
				if got != nil {
					t.Fatalf("got %v, want nil (the plain cut)", got)
				}
				return
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v\nwant %v", got, tc.want)
			}
			var sum uint64
			for _, n := range got {
				if n == 0 || uint64(n) > tc.cs {
					t.Fatalf("chunk of %d B (chunk size %d)", n, tc.cs)
				}
				sum += uint64(n)
			}
			if head := tc.total - sum; head%tc.cs != 0 || head/tc.cs != tc.wantHeadChunks {
				t.Fatalf("tail of %d B leaves %d B before it, want %d whole chunks", sum, head, tc.wantHeadChunks)
			}
			if last := got[len(got)-tc.streams:]; !slices.Equal(last, rep(tc.streams, uint32(tc.minChunk))) {
				t.Fatalf("last round %v, want %d chunks of %d", last, tc.streams, tc.minChunk)
			}
		})
	}
}

// TestSplitTailPlan: a split plan still moves every byte where its op
// says, its chunks have the lengths ChunkLen gives, and it splits only
// before the first chunk is cut.
func TestSplitTailPlan(t *testing.T) {
	ops := scattered(700, 96) // 67,200 B
	const chunk = 4096
	p, err := NewPlan(ops, chunk)
	if err != nil {
		t.Fatal(err)
	}
	plain := p.Len()
	if !p.SplitTail(4, 512) {
		t.Fatal("SplitTail left a 17-chunk plan over 4 streams as it was")
	}
	want := tailSizes(p.Total, chunk, 4, 512)
	var tail uint64
	for _, n := range want {
		tail += uint64(n)
	}
	if p.Len() != int((p.Total-tail)/chunk)+len(want) || p.Len() <= plain {
		t.Fatalf("%d chunks after the split (%d before, tail %v)", p.Len(), plain, want)
	}
	checkPlan(t, ops, p, chunk)
	for i, n := range want {
		if got := p.ChunkLen(p.Len() - len(want) + i); got != n {
			t.Fatalf("tail chunk %d: %d B, want %d", i, got, n)
		}
	}
	if p.SplitTail(4, 256) {
		t.Fatal("a plan was split twice")
	}
	q, _ := NewPlan(ops, chunk)
	q.Chunk(0)
	if q.SplitTail(4, 512) {
		t.Fatal("a plan whose first chunk was cut was split")
	}
}

// TestSplitTailMappedPlan: a mapped plan's split chunks name their own
// offsets in the stream.
func TestSplitTailMappedPlan(t *testing.T) {
	gather := func(off uint64, n uint32, segs []device.Seg) []device.Seg {
		return append(segs, device.Seg{Addr: device.Addr(off), Len: uint64(n)})
	}
	const total, chunk = 40*kib + 3, 4 * kib
	p, err := NewMappedPlan(total, chunk, 9, gather)
	if err != nil {
		t.Fatal(err)
	}
	if !p.SplitTail(2, kib) {
		t.Fatal("not split")
	}
	var off uint64
	for i := 0; i < p.Len(); i++ {
		c := p.Chunk(i)
		src := c.Sources(nil)
		if c.Off != off || c.Len != p.ChunkLen(i) || len(src) != 1 || src[0].Addr != device.Addr(off) || c.Dst[0] != (DstSeg{Region: 9, Len: c.Len, Off: off}) {
			t.Fatalf("chunk %d: Off %d Len %d (ChunkLen %d), sources %v, dst %+v; want at %d", i, c.Off, c.Len, p.ChunkLen(i), src, c.Dst, off)
		}
		off += uint64(c.Len)
	}
	if off != total {
		t.Fatalf("chunks cover %d B, want %d", off, total)
	}
}

// TestSplitTailGrowingPlan: a push in pieces (a growing plan) whose tail is
// split when it is submitted, before most of its ops came: Ready never
// names a chunk whose bytes the ops given so far do not cover, and once
// complete the plan cuts every chunk at the split's lengths.
func TestSplitTailGrowingPlan(t *testing.T) {
	ops := scattered(700, 96) // 67,200 B
	const chunk = 4096
	var total uint64
	for _, o := range ops {
		total += o.Len
	}
	for _, first := range []int{1, 50, 300} {
		p, err := NewGrowingPlan(total, chunk, ops[:first])
		if err != nil {
			t.Fatal(err)
		}
		if !p.SplitTail(4, 512) {
			t.Fatalf("first %d ops: SplitTail left the growing plan as it was", first)
		}
		have := uint64(0)
		for _, o := range ops[:first] {
			have += o.Len
		}
		for at := first; ; {
			for i := 0; i < p.Ready(); i++ {
				if end := p.offset(i) + uint64(p.ChunkLen(i)); end > have {
					t.Fatalf("first %d, %d of %d B given: Ready %d names chunk %d ending at %d", first, have, total,
						p.Ready(), i, end)
				}
			}
			if at == len(ops) {
				break
			}
			next := min(at+37, len(ops))
			if err := p.Grow(ops[at:next]); err != nil {
				t.Fatal(err)
			}
			for _, o := range ops[at:next] {
				have += o.Len
			}
			at = next
		}
		if !p.Complete() || p.Ready() != p.Len() {
			t.Fatalf("first %d: complete %v, ready %d of %d", first, p.Complete(), p.Ready(), p.Len())
		}
		checkPlan(t, ops, p, chunk)
	}
}
