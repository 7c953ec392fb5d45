package cuda

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/devicetest"
)

// hndSegs lists, in canonical order (for each block, token, head), the row
// pieces of nb random distinct blocks of an HND-like layout in the pool
// [base, base+size): a block holds heads x bs pieces of piece bytes, head
// h's tokens contiguous, so piece (t, h) is at block + (h*bs + t)*piece.
// off shifts every address (unaligned layouts).
func hndSegs(rng *rand.Rand, base device.Addr, size uint64, nb, bs, heads, piece, off uint64) []device.Seg {
	blockBytes := heads * bs * piece
	perm := rng.Perm(int((size - off) / blockBytes))
	segs := make([]device.Seg, 0, nb*bs*heads)
	for _, b := range perm[:nb] {
		blk := base + device.Addr(off+uint64(b)*blockBytes)
		for t := range bs {
			for h := range heads {
				segs = append(segs, device.Seg{Addr: blk + device.Addr((h*bs+t)*piece), Len: piece})
			}
		}
	}
	return segs
}

// stridedCase is a segment list for the copy tests and whether it must
// take the strided kernel.
type stridedCase struct {
	name    string
	segs    []device.Seg
	strided bool
}

// stridedCases are lists inside the pool [pool, pool+size) (8 MiB or
// more): HND-like rows with 16-, 8-, 4- and 1-byte alignment, cut inside a
// row, and lists that must keep the plain kernel.
func stridedCases(rng *rand.Rand, pool device.Addr, size uint64) []stridedCase {
	return []stridedCase{
		{"hnd", hndSegs(rng, pool, size, 40, 16, 8, 256, 0), true},
		{"hnd-8B-words", hndSegs(rng, pool, size, 9, 16, 3, 200, 8), true},
		{"hnd-4B-words", hndSegs(rng, pool, size, 9, 16, 4, 100, 4), true},
		{"hnd-unaligned", hndSegs(rng, pool, size, 9, 16, 3, 200, 5), true},
		{"hnd-odd-pieces", hndSegs(rng, pool, size, 7, 32, 5, 17, 3), true},
		{"hnd-cut", hndSegs(rng, pool, size, 6, 16, 8, 256, 0)[3:700], true},
		{"16KiB-blocks", devicetest.BlockSegs(rng, pool, size, 300, 16<<10), false},
		{"odd", devicetest.CellSegs(rng, pool, size, 64, 1, devicetest.OddLens(rng)), false},
	}
}

// expand lists the pieces of descriptors ds, checking that their slot
// side is contiguous from *slot on (advancing it).
func expand(t *testing.T, ds []sdesc, gather bool, slot *uint64) []device.Seg {
	t.Helper()
	var out []device.Seg
	for k, d := range ds {
		dev, dev1, dev2, sl, sl1, sl2 := d.src, d.src1, d.src2, d.dst, d.dst1, d.dst2
		if !gather {
			dev, dev1, dev2, sl, sl1, sl2 = d.dst, d.dst1, d.dst2, d.src, d.src1, d.src2
		}
		if d.len == 0 || d.n1 == 0 || d.n2 == 0 {
			t.Fatalf("descriptor %d %+v is empty", k, d)
		}
		if (d.n1 == 1 && dev1|sl1 != 0) || (d.n2 == 1 && dev2|sl2 != 0) {
			t.Errorf("descriptor %d %+v: stride of a dimension of one is not 0", k, d)
		}
		for i2 := range uint64(d.n2) {
			for i1 := range uint64(d.n1) {
				if got := sl + i2*sl2 + i1*sl1; got != *slot {
					t.Fatalf("descriptor %d piece (%d, %d): slot address %#x, want %#x", k, i2, i1, got, *slot)
				}
				*slot += uint64(d.len)
				out = append(out, device.Seg{Addr: device.Addr(dev + i2*dev2 + i1*dev1), Len: uint64(d.len)})
			}
		}
	}
	return out
}

// cutSegs is segs without empty segments and cut into pieces of at most
// maxLen: what the descriptors must expand to.
func cutSegs(segs []device.Seg, maxLen uint64) []device.Seg {
	var out []device.Seg
	for _, s := range segs {
		for o := uint64(0); o < s.Len; o += maxLen {
			out = append(out, device.Seg{Addr: s.Addr + device.Addr(o), Len: min(maxLen, s.Len-o)})
		}
	}
	return out
}

// compressAll runs compressSegs over segs with out slots of room
// descriptors, as kernelMove does, and checks every call's bookkeeping.
func compressAll(t *testing.T, segs []device.Seg, gather bool, maxLen uint64, room int) []sdesc {
	t.Helper()
	const pinned = 0x7f00_0000_0000
	var all []sdesc
	out := make([]sdesc, room)
	si, so, p := 0, uint64(0), uint64(pinned)
	limit := len(cutSegs(segs, maxLen)) + 1 // each call takes a piece at least
	for calls := 0; si < len(segs); calls++ {
		if calls > limit {
			t.Fatal("compressSegs does not progress")
		}
		n, pieces, nsi, nso, np := compressSegs(out, segs, si, so, p, gather, maxLen)
		if n > room {
			t.Fatalf("%d descriptors written into %d", n, room)
		}
		got := 0
		var bytes uint64
		for _, d := range out[:n] {
			got += int(d.n1 * d.n2)
			bytes += uint64(d.len) * uint64(d.n1*d.n2)
			if uint64(d.len)*uint64(d.n1*d.n2) > maxLen {
				t.Fatalf("descriptor %+v holds more than %d B", d, maxLen)
			}
		}
		if got != pieces || np-p != bytes {
			t.Fatalf("call %d: %d descriptors of %d pieces, %d B; reported %d pieces, %d B", calls, n, got, bytes, pieces, np-p)
		}
		all = append(all, out[:n]...)
		si, so, p = nsi, nso, np
	}
	if total := p - pinned; total != device.SegsLen(segs) {
		t.Fatalf("slot advanced %d B, segments hold %d", total, device.SegsLen(segs))
	}
	slot := uint64(pinned)
	if got, want := expand(t, all, gather, &slot), cutSegs(segs, maxLen); !slices.Equal(got, want) {
		t.Fatalf("descriptors expand to %d pieces, want the %d of the input\n got %v\nwant %v", len(got), len(want), head(got), head(want))
	}
	return all
}

// segsOf makes segments of address, length pairs.
func segsOf(al ...uint64) []device.Seg {
	segs := make([]device.Seg, 0, len(al)/2)
	for i := 0; i+1 < len(al); i += 2 {
		segs = append(segs, device.Seg{Addr: device.Addr(al[i]), Len: al[i+1]})
	}
	return segs
}

func head(s []device.Seg) []device.Seg { return s[:min(len(s), 12)] }

func TestCompressSegs(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const pool = 1 << 40
	hnd := hndSegs(rng, pool, 1<<30, 3, 16, 8, 256, 0)
	d2 := func(dev, slot uint64, n, n1, s1, n2, s2 uint64) sdesc { // a gather descriptor
		d := sdesc{src: dev, dst: slot, src1: s1, src2: s2, len: uint32(n), n1: uint32(n1), n2: uint32(n2)}
		if n1 > 1 {
			d.dst1 = n
		}
		if n2 > 1 {
			d.dst2 = n * n1
		}
		return d
	}
	const P = 0x7f00_0000_0000
	cases := []struct {
		name   string
		segs   []device.Seg
		maxLen uint64
		gather bool
		want   []sdesc
	}{
		{"hnd block per descriptor", hnd, 32 << 10, true, []sdesc{
			d2(uint64(hnd[0].Addr), P, 256, 8, 4096, 16, 256),
			d2(uint64(hnd[128].Addr), P+32<<10, 256, 8, 4096, 16, 256),
			d2(uint64(hnd[256].Addr), P+64<<10, 256, 8, 4096, 16, 256),
		}},
		{"hnd cap cuts between rows", hnd[:128], 16 << 10, true, []sdesc{
			d2(uint64(hnd[0].Addr), P, 256, 8, 4096, 8, 256),
			d2(uint64(hnd[0].Addr)+8*256, P+16<<10, 256, 8, 4096, 8, 256),
		}},
		{"hnd scatter", hnd[:128], 32 << 10, false, []sdesc{{
			dst: uint64(hnd[0].Addr), dst1: 4096, dst2: 256, src: P, src1: 256, src2: 2048, len: 256, n1: 8, n2: 16,
		}}},
		{"row broken mid-way", segsOf(100, 8, 200, 8, 300, 8, 108, 8, 208, 8, 900, 8, 950, 8), 1 << 10, true, []sdesc{
			d2(100, P, 8, 3, 100, 1, 0),    // the first row; the second breaks after 2 pieces
			d2(108, P+24, 8, 2, 100, 1, 0), // which start a run of their own, broken too
			d2(900, P+40, 8, 2, 50, 1, 0),
		}},
		{"backward strides", segsOf(1000, 4, 900, 4, 800, 4, 996, 4, 896, 4, 796, 4), 1 << 10, true, []sdesc{
			d2(1000, P, 4, 3, 1<<64-100, 2, 1<<64-4),
		}},
		{"irregular lengths stay", segsOf(10, 5, 0, 0, 20, 6, 40, 7, 60, 5), 1 << 10, true, []sdesc{
			d2(10, P, 5, 1, 0, 1, 0), d2(20, P+5, 6, 1, 0, 1, 0), d2(40, P+11, 7, 1, 0, 1, 0), d2(60, P+18, 5, 1, 0, 1, 0),
		}},
		{"repeated address is no run", segsOf(64, 16, 64, 16, 64, 16), 1 << 10, true, []sdesc{
			d2(64, P, 16, 1, 0, 1, 0), d2(64, P+16, 16, 1, 0, 1, 0), d2(64, P+32, 16, 1, 0, 1, 0),
		}},
		{"long segment cut at the cap", segsOf(1<<20, 2500), 1 << 10, true, []sdesc{
			d2(1<<20, P, 1024, 1, 0, 1, 0), d2(1<<20+1024, P+1024, 1024, 1, 0, 1, 0), d2(1<<20+2048, P+2048, 452, 1, 0, 1, 0),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := compressAll(t, tc.segs, tc.gather, tc.maxLen, 384)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestCompressSegsResume: a full output stops the walk where the next call
// goes on, whatever the room, and the descriptors still expand exactly.
func TestCompressSegsResume(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	segs := hndSegs(rng, 1<<40, 1<<30, 10, 16, 8, 256, 0)
	segs = append(segs, devicetest.CellSegs(rng, 1<<41, 1<<20, 50, 1, devicetest.OddLens(rng))...)
	for _, room := range []int{3, 4, 7, 384} {
		for _, gather := range []bool{true, false} {
			t.Run(fmt.Sprint(room, gather), func(t *testing.T) {
				n := len(compressAll(t, segs[5:], gather, 16<<10, room))
				if n < 20+50 {
					t.Errorf("%d descriptors, want at least one per 16 KiB of the HND blocks and one per odd segment", n)
				}
			})
		}
	}
	if n, _, si, _, _ := compressSegs(make([]sdesc, 2), segs, 0, 0, 0, true, 1<<10); n != 0 || si != 0 {
		t.Errorf("room 2: wrote %d, moved to segment %d; want nothing", n, si)
	}
}

// FuzzCompressSegs: any segment list compresses to descriptors that expand
// to exactly its pieces, in order, each descriptor within the cap.
func FuzzCompressSegs(f *testing.F) {
	f.Add([]byte{0x10, 0x20, 0x30, 0x01, 0x02}, uint16(1024), uint8(5))
	f.Add(make([]byte, 64), uint16(256), uint8(3))
	f.Fuzz(func(t *testing.T, prog []byte, maxLen uint16, room uint8) {
		segs := fuzzSegs(prog)
		if len(segs) == 0 {
			return
		}
		compressAll(t, segs, len(prog)%2 == 0, uint64(maxLen)+1, int(room%64)+3)
	})
}

// fuzzSegs turns fuzz bytes into a segment list rich in strided runs:
// each 4-byte op repeats a (length, stride) pattern a few times from a
// base, in one or two dimensions, or adds a lone segment.
func fuzzSegs(prog []byte) []device.Seg {
	var segs []device.Seg
	addr := uint64(1 << 30)
	for len(prog) >= 4 && len(segs) < 4096 {
		op := binary.LittleEndian.Uint32(prog)
		prog = prog[4:]
		n := uint64(op & 63) // 0: an empty segment now and then
		s1 := uint64(int64(int8(op>>6))) * 16
		n1 := uint64(op>>14)&7 + 1
		n2 := uint64(op>>17)&7 + 1
		s2 := uint64(int64(int8(op>>20))) * 4
		switch op >> 28 {
		case 0: // lone segment somewhere
			addr += uint64(op >> 8)
			segs = append(segs, device.Seg{Addr: device.Addr(addr), Len: n * 37})
		default:
			for i2 := range n2 {
				for i1 := range n1 {
					segs = append(segs, device.Seg{Addr: device.Addr(addr + i2*s2 + i1*s1), Len: n})
				}
			}
			addr += uint64(op >> 24)
		}
	}
	return segs
}

// BenchmarkCompressSegsHND: the host's cost of compressing one 4 MiB chunk
// of an HND layout (16,384 row pieces of 256 bytes) into strided
// descriptors, in slot-sized calls as kernelMove makes them.
func BenchmarkCompressSegsHND(b *testing.B) {
	segs := hndSegs(rand.New(rand.NewPCG(5, 6)), 1<<40, 1<<34, 128, 16, 8, 256, 0)
	out := make([]sdesc, ringSlotDescs*24/64)
	b.SetBytes(4 << 20)
	for range b.N {
		si, so, p := 0, uint64(0), uint64(0)
		for si < len(segs) {
			_, _, si, so, p = compressSegs(out, segs, si, so, p, true, DefaultStridedMaxBytes)
		}
	}
}

// The strided descriptor cap is the device's, from its Config: the
// default when unset, else what the Config says (the GPU benchmarks
// compare caps this way, not through a package variable).
func TestStridedMaxBytesFromConfig(t *testing.T) {
	l := fakeLibrary(t)
	tests := []struct {
		name      string
		cfg, want uint64
	}{
		{"unset", 0, DefaultStridedMaxBytes},
		{"8 KiB", 8 << 10, 8 << 10},
		{"64 KiB", 64 << 10, 64 << 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := openFake(t, l, Config{PTX: fakeStridedPTX, StridedMaxBytes: tc.cfg})
			if d.stridedMax != tc.want {
				t.Errorf("got %d, want %d", d.stridedMax, tc.want)
			}
		})
	}
}
