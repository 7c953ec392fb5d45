package kvlayout

import (
	"encoding/binary"
	"errors"
	"testing"
)

// fuzzBytes reads numbers from fuzz input, zeros once it runs out.
type fuzzBytes []byte

func (b *fuzzBytes) u8() uint8 {
	if len(*b) == 0 {
		return 0
	}
	v := (*b)[0]
	*b = (*b)[1:]
	return v
}

func (b *fuzzBytes) u16() uint16 { return uint16(b.u8()) | uint16(b.u8())<<8 }
func (b *fuzzBytes) u32() uint32 { return uint32(b.u16()) | uint32(b.u16())<<16 }
func (b *fuzzBytes) u64() uint64 { return uint64(b.u32()) | uint64(b.u32())<<32 }

// checkSegments walks [off, off+n) of s and fails on a segment outside its
// region's length, lengths not summing to n, or wire offsets with a gap.
func checkSegments(t *testing.T, s *Side, lens []uint64, off, n uint64) {
	next := off
	s.Segments(off, n, func(layer, region int, toff uint64, length uint32, wire uint64) {
		l := uint64(length)
		if wire != next || l == 0 {
			t.Fatalf("segment at wire %d (+%d), want wire %d, nonzero", wire, l, next)
		}
		if region < 0 || region >= len(lens) || toff > lens[region] || l > lens[region]-toff {
			t.Fatalf("layer %d: segment [%d, +%d) outside region %d (lengths %v)", layer, toff, l, region, lens)
		}
		next += l
	})
	if want := off + min(n, s.Len()-min(off, s.Len())); next != want {
		t.Fatalf("segments of [%d, +%d) end at %d, want %d (Len %d)", off, n, next, want, s.Len())
	}
}

// fuzzTable reads a block table of n ids below blocks.
func fuzzTable(b *fuzzBytes, n, blocks uint32) []uint32 {
	table := make([]uint32, n)
	for i := range table {
		table[i] = uint32(b.u16()) % blocks
	}
	return table
}

// FuzzValidate: any layout the input describes is either refused or, once
// accepted, maps every byte of a transfer into its tensors.
func FuzzValidate(f *testing.F) {
	f.Add([]byte{2, 16, 0, 4, 0, 8, 0, 0, 0, 8, 0, 2})
	// Accepted: bf16, 2 blocks of 4 tokens, 2 heads, one 4096-byte tensor,
	// one part of 8 elements (block 128, slot 32, head 16 bytes apart).
	f.Add([]byte{2, 4, 2, 2, 0, 2, 0, 0, 16, 0, 0, 0, 1, 8, 0, 0, 0, 0, 0, 0, 128, 0, 0, 0, 32, 0, 16, 0, 1, 3, 1, 0, 0, 0, 1, 0, 1, 0, 2, 0})
	f.Add(binary.LittleEndian.AppendUint64([]byte{3, 128, 0, 2, 0, 1, 0, 0, 0, 1, 0, 2, 64, 0, 0}, 1<<40))
	f.Fuzz(func(t *testing.T, data []byte) {
		b := fuzzBytes(data)
		l := Layout{
			DType: DType(b.u8() % 8), BlockSize: uint32(b.u8()), Blocks: uint32(b.u8()),
			Heads: uint32(b.u8() % 16), HeadLo: uint32(b.u8() % 16), HeadHi: uint32(b.u8() % 17),
		}
		nt := int(b.u8()%4) + 1
		lens := make([]uint64, nt)
		for i := range lens {
			lens[i] = uint64(b.u32()) << (b.u8() % 16)
		}
		np := int(b.u8() % 10)
		for range np {
			l.Parts = append(l.Parts, Part{
				Width: uint32(b.u16() % 600), Tensor: int(b.u8() % 5), Offset: uint64(b.u32()),
				BlockStride: uint64(b.u32()), SlotStride: uint64(b.u16()), HeadStride: uint64(b.u16()),
			})
		}
		if b.u8()%8 == 0 { // now and then strides near 2^64
			l.Parts = append(l.Parts, Part{Width: 1, BlockStride: b.u64(), SlotStride: b.u64(), HeadStride: b.u64()})
		}
		if err := l.Validate(lens); err != nil {
			return
		}
		regions := make([]int, l.NumTensors())
		for i := range regions {
			regions[i] = i
		}
		table := fuzzTable(&b, uint32(b.u8()%8)+1, l.Blocks)
		tokens := uint64(len(table)) * uint64(l.BlockSize)
		first := uint64(b.u16()) % tokens
		written := b.u8()%2 == 0
		s, err := NewSide(SideSpec{Layout: l, Regions: [][]int{regions}, Table: table, FirstToken: first, Tokens: tokens - first,
			HeadLo: l.HeadLo, HeadHi: l.HeadHi, Cols: Columns(l, l), Written: written})
		lo := first / uint64(l.BlockSize)
		if written && slowRepeat(table[lo:]) >= 0 {
			if !errors.Is(err, ErrRepeatedBlock) {
				t.Fatalf("NewSide of a destination naming a block twice in %v from entry %d: %v; want ErrRepeatedBlock", table, lo, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("NewSide of a valid layout: %v", err)
		}
		if s.Len() > 1<<24 {
			return
		}
		checkSegments(t, s, lens, 0, s.Len())
	})
}

// FuzzSegments: random sides of the presets, cut at random points.
func FuzzSegments(f *testing.F) {
	f.Add([]byte{0, 1, 16, 4, 2, 8, 1, 0, 0, 10, 0, 7, 0})
	f.Add([]byte{4, 2, 128, 8, 4, 64, 3, 1, 3, 200, 1, 77, 1, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		b := fuzzBytes(data)
		s, all := fuzzSide(t, &b, TokenMajor)
		for off := uint64(0); off < s.Len(); {
			n := 1 + uint64(b.u16())
			if b.u8()%4 == 0 {
				n = 1 + uint64(b.u8()%7)
			}
			checkSegments(t, s, all, off, n)
			off += n
		}
		checkSegments(t, s, all, s.Len()-1, 1<<40) // cut at Len
	})
}

// fuzzSide reads a side of a random preset, sliced and cut against a
// random peer, over 1 to 3 layers, and the lengths of its regions.
func fuzzSide(t *testing.T, b *fuzzBytes, order Order) (*Side, []uint64) {
	names := Presets()
	name := names[int(b.u8())%len(names)]
	peer := names[int(b.u8())%len(names)]
	p := Params{DType: BF16, BlockSize: uint32(b.u8()%128) + 1, Heads: uint32(b.u8()%8) + 1, HeadSize: uint32(b.u8()%64) + 1}
	p.HeadLo = uint32(b.u8()) % p.Heads
	p.HeadHi = p.HeadLo + 1 + uint32(b.u8())%(p.Heads-p.HeadLo)
	p.Blocks = uint32(b.u8()%16) + 1
	if IsMLA(name) {
		p.Heads, p.HeadLo, p.HeadHi, p.Widths = 1, 0, 1, []uint32{uint32(b.u8()) + 1, uint32(b.u8()%64) + 1}
	}
	l, lens, err := Preset(name, p)
	if err != nil {
		t.Fatalf("Preset(%s, %+v): %v", name, p, err)
	}
	cols := Columns(l, l)
	if IsMLA(name) == IsMLA(peer) {
		q := p
		q.BlockSize = 16
		if pl, _, err := Preset(peer, q); err == nil && Check(l, pl) == nil {
			cols = Columns(l, pl)
		}
	}
	layers := int(b.u8()%3) + 1
	regions := make([][]int, layers)
	all := make([]uint64, 0, layers*len(lens))
	for i := range regions {
		for j := range lens {
			regions[i] = append(regions[i], len(all)+j)
		}
		all = append(all, lens...)
	}
	table := fuzzTable(b, uint32(b.u8()%6)+1, p.Blocks)
	room := uint64(len(table)) * uint64(p.BlockSize)
	first := uint64(b.u16()) % room
	tokens := 1 + uint64(b.u16())%(room-first)
	lo := p.HeadLo + uint32(b.u8())%(p.HeadHi-p.HeadLo)
	hi := lo + 1 + uint32(b.u8())%(p.HeadHi-lo)
	s, err := NewSide(SideSpec{Layout: l, Regions: regions, Table: table, FirstToken: first, Tokens: tokens, HeadLo: lo, HeadHi: hi, Cols: cols, Order: order})
	if err != nil {
		t.Fatalf("NewSide: %v", err)
	}
	return s, all
}

// slowRepeat is firstRepeat the obvious way: the smallest j such that
// used[j] occurs in used[:j], or -1.
func slowRepeat(used []uint32) int {
	for j := range used {
		for i := range j {
			if used[i] == used[j] {
				return j
			}
		}
	}
	return -1
}

// FuzzCheckDistinct: the bitmap and the sort find the repeat the
// quadratic scan finds, for dense ids, sparse ids and any token range.
func FuzzCheckDistinct(f *testing.F) {
	f.Add([]byte{4, 0, 1, 2, 2})
	f.Add([]byte{200, 3, 16, 9, 0, 9, 0, 1, 0})
	f.Add([]byte{7, 30, 2, 0, 5, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		b := fuzzBytes(data)
		shift := b.u8() % 32 // 0: dense ids, bitmap; large: sparse, sorted
		bs := uint32(b.u8()%8) + 1
		table := make([]uint32, int(b.u8())+1)
		for i := range table {
			table[i] = uint32(b.u16()%64) << shift
		}
		room := uint64(len(table)) * uint64(bs)
		first := uint64(b.u16()) % room
		tokens := 1 + uint64(b.u16())%(room-first)
		lo, hi := first/uint64(bs), (first+tokens-1)/uint64(bs)+1
		if got, want := firstRepeat(table[lo:hi]), slowRepeat(table[lo:hi]); got != want {
			t.Fatalf("firstRepeat(%v) = %d, want %d", table[lo:hi], got, want)
		}
		err := CheckDistinct(table, bs, first, tokens)
		if (err != nil) != (slowRepeat(table[lo:hi]) >= 0) || err != nil && !errors.Is(err, ErrRepeatedBlock) {
			t.Fatalf("CheckDistinct(%v, %d, %d, %d) = %v", table, bs, first, tokens, err)
		}
	})
}
