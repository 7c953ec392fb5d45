package kvlayout

import (
	"bytes"
	"fmt"
	"math/rand"
	"testing"
)

// The logical-row harness: engines' ranks hold tensors in their own
// layouts; every logical row (layer, token position, head) of a source is a
// distinct slice of a random pool, so a destination row can be checked
// against the row it must equal, independent of the mapping under test.

// pool is random bytes that logical rows are cut from.
var pool = func() []byte {
	r := rand.New(rand.NewSource(7))
	b := make([]byte, 1<<20)
	r.Read(b)
	return b
}()

// logicalRow is the content of row (layer, pos, head): rowBytes of the pool
// at an offset mixed from the three, so neighbouring rows differ.
func logicalRow(layer int, pos uint64, head uint32, rowBytes uint64) []byte {
	k := uint64(layer)*0x9E3779B97F4A7C15 ^ pos*0xC2B2AE3D27D4EB4F ^ uint64(head)*0x165667B19E3779F9
	k ^= k >> 29
	k *= 0xBF58476D1CE4E5B9
	k ^= k >> 32
	off := k % (uint64(len(pool)) - rowBytes)
	return pool[off : off+rowBytes]
}

// rank is one engine rank: its layout and, per layer, its tensors.
type rank struct {
	l       Layout
	tensors [][][]byte // [layer][tensor]
	table   []uint32
	first   uint64
	order   Order // the canonical order its sides use
}

// newRank builds a rank of a preset with a random block table of distinct
// ids long enough for first+tokens, and random spare blocks.
func newRank(t testing.TB, r *rand.Rand, name string, p Params, layers int, first, tokens uint64) *rank {
	t.Helper()
	need := (first + tokens + uint64(p.BlockSize) - 1) / uint64(p.BlockSize)
	tableLen := need + uint64(r.Intn(3))
	p.Blocks = uint32(tableLen) + uint32(r.Intn(4))
	l, lens, err := Preset(name, p)
	if err != nil {
		t.Fatalf("preset %s %+v: %v", name, p, err)
	}
	perm := r.Perm(int(p.Blocks))
	rk := &rank{l: l, first: first, table: make([]uint32, tableLen)}
	for i := range rk.table {
		rk.table[i] = uint32(perm[i])
	}
	rk.tensors = make([][][]byte, layers)
	for li := range rk.tensors {
		rk.tensors[li] = make([][]byte, len(lens))
		for ti, n := range lens {
			rk.tensors[li][ti] = sentinel(r, n)
		}
	}
	return rk
}

// sentinel is n bytes of the pool from a random offset, wrapping: what a
// destination holds before a transfer, and must still hold wherever no row
// was moved.
func sentinel(r *rand.Rand, n uint64) []byte {
	b := make([]byte, n)
	at := uint64(r.Intn(len(pool)))
	for i := uint64(0); i < n; {
		c := uint64(copy(b[i:], pool[at:]))
		i += c
		at = 0
	}
	return b
}

// rowAddr is the address of element col of part pi of row (block id b,
// slot s, head h) in the rank's layout, by the model's formula.
func (rk *rank) rowAddr(pi int, b uint32, s uint64, h uint32) uint64 {
	p := &rk.l.Parts[pi]
	return p.Offset + uint64(b)*p.BlockStride + s*p.SlotStride + uint64(h-rk.l.HeadLo)*p.HeadStride
}

// putRow writes the logical row at table position pos, head h, of layer li
// into the rank's tensors, part by part.
func (rk *rank) putRow(li int, pos uint64, h uint32, row []byte) {
	bs := uint64(rk.l.BlockSize)
	e := rk.l.DType.Size()
	var at uint64
	for pi, p := range rk.l.Parts {
		n := uint64(p.Width) * e
		a := rk.rowAddr(pi, rk.table[pos/bs], pos%bs, h)
		copy(rk.tensors[li][p.Tensor][a:a+n], row[at:at+n])
		at += n
	}
}

// fill writes the logical rows of positions [first, first+tokens) of the
// given layers. Every other byte keeps its sentinel, so a row taken from
// the wrong place cannot equal the row expected.
func (rk *rank) fill(layers []int, tokens uint64) {
	rowBytes := rk.l.RowWidth() * rk.l.DType.Size()
	for _, li := range layers {
		for pos := rk.first; pos < rk.first+tokens; pos++ {
			for h := rk.l.HeadLo; h < rk.l.HeadHi; h++ {
				rk.putRow(li, pos, h, logicalRow(li, pos, h, rowBytes))
			}
		}
	}
}

// clone copies the rank's tensors (the expected state starts as this).
func (rk *rank) clone() *rank {
	c := *rk
	c.tensors = make([][][]byte, len(rk.tensors))
	for li := range rk.tensors {
		c.tensors[li] = make([][]byte, len(rk.tensors[li]))
		for ti, b := range rk.tensors[li] {
			c.tensors[li][ti] = bytes.Clone(b)
		}
	}
	return &c
}

// flat lists the tensors of the given layers in order, and the regions of
// each layer as indices into that list.
func (rk *rank) flat(layers []int) ([][]byte, [][]int) {
	var ts [][]byte
	regions := make([][]int, len(layers))
	for i, li := range layers {
		for _, b := range rk.tensors[li] {
			regions[i] = append(regions[i], len(ts))
			ts = append(ts, b)
		}
	}
	return ts, regions
}

func (rk *rank) side(t testing.TB, layers []int, tokens uint64, lo, hi uint32, cols []Col) (*Side, [][]byte) {
	t.Helper()
	ts, regions := rk.flat(layers)
	s, err := NewSide(SideSpec{Layout: rk.l, Regions: regions, Table: rk.table, FirstToken: rk.first, Tokens: tokens, HeadLo: lo, HeadHi: hi, Cols: cols, Order: rk.order})
	if err != nil {
		t.Fatalf("NewSide: %v", err)
	}
	return s, ts
}

// cuts returns random cut points of [0, n): chunk boundaries, from single
// bytes to whole runs.
func cuts(r *rand.Rand, n uint64) []uint64 {
	c := []uint64{0}
	for at := uint64(0); at < n; {
		var step uint64
		switch r.Intn(4) {
		case 0:
			step = 1 + uint64(r.Intn(3))
		case 1:
			step = 1 + uint64(r.Int63n(int64(n)))
		default:
			step = 1 + uint64(r.Intn(4096))
		}
		at = min(at+step, n)
		c = append(c, at)
	}
	return c
}

// moveKV gathers src's canonical stream in random chunks and scatters it
// into dst in other random chunks.
func moveKV(t testing.TB, r *rand.Rand, src *Side, srcT [][]byte, dst *Side, dstT [][]byte) {
	t.Helper()
	if src.Len() != dst.Len() {
		t.Fatalf("canonical length: source %d, destination %d", src.Len(), dst.Len())
	}
	wire := make([]byte, src.Len())
	c := cuts(r, src.Len())
	for i := 1; i < len(c); i++ {
		if err := Gather(src, srcT, c[i-1], wire[c[i-1]:c[i]]); err != nil {
			t.Fatalf("gather [%d, %d): %v", c[i-1], c[i], err)
		}
	}
	c = cuts(r, dst.Len())
	for i := 1; i < len(c); i++ {
		if err := Scatter(dst, dstT, c[i-1], wire[c[i-1]:c[i]]); err != nil {
			t.Fatalf("scatter [%d, %d): %v", c[i-1], c[i], err)
		}
	}
}

// equalTensors reports the first byte where got and want differ.
func equalTensors(got, want *rank) error {
	for li := range want.tensors {
		for ti := range want.tensors[li] {
			g, w := got.tensors[li][ti], want.tensors[li][ti]
			if !bytes.Equal(g, w) {
				i := 0
				for i < len(g) && g[i] == w[i] {
					i++
				}
				return fmt.Errorf("layer %d tensor %d: first difference at byte %d of %d: got %#x, want %#x", li, ti, i, len(g), g[i], w[i])
			}
		}
	}
	return nil
}
