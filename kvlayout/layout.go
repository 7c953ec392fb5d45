package kvlayout

import (
	"errors"
	"fmt"
	"sort"
)

// Limits of a layout. A row of 65535 elements is larger than any KV row an
// engine stores (MLA's is 576); eight parts leave room for K, V and their
// scales kept apart.
const (
	MaxParts     = 8
	MaxRowWidth  = 65535
	MaxTensors   = 8
	maxPartName  = 32
	packedKVName = "kv"
)

// ErrInvalid is wrapped by every error that refuses a layout, a side or a
// tensor description.
var ErrInvalid = errors.New("invalid kv layout")

// Part is one piece of the logical row of (token, head) as one tensor
// stores it: K or V, or MLA's latent or rope. Offsets and strides are in
// bytes; Width is in elements.
type Part struct {
	Name   string // informational ("k", "v", "latent", "rope", "kv_c")
	Width  uint32 // elements in the part's row
	Tensor int    // index of the layer's tensor (region) that holds the part
	// Offset is where the row of block 0, slot 0 and head HeadLo starts.
	Offset uint64
	// Strides between consecutive blocks, token slots within a block, and
	// held heads. Row (b, s, h) starts at
	// Offset + b*BlockStride + s*SlotStride + (h-HeadLo)*HeadStride.
	BlockStride, SlotStride, HeadStride uint64
}

// Layout is one layer of a KV cache as one engine stores it. Every layer of
// a cache has the same layout; each layer has its own tensors.
type Layout struct {
	DType     DType
	BlockSize uint32 // tokens per block
	Blocks    uint32 // blocks the tensors hold; block ids are 0..Blocks-1
	Heads     uint32 // total kv heads of the model (after GQA, before TP); MLA: 1
	// HeadLo and HeadHi are the slice [HeadLo, HeadHi) of the kv heads this
	// rank holds.
	HeadLo, HeadHi uint32
	Parts          []Part // in logical order: K then V; latent then rope
}

// Merged is l with each part that continues the one before it in memory
// (same tensor and strides, starting where its row ends: vLLM's packed
// K|V) joined into it, so that a row both sides keep whole moves as one
// column. Check and Columns see the same logical row either way.
func (l Layout) Merged() Layout {
	if len(l.Parts) < 2 {
		return l
	}
	e := l.DType.Size()
	parts := []Part{l.Parts[0]}
	for _, p := range l.Parts[1:] {
		q := &parts[len(parts)-1]
		if p.Tensor == q.Tensor && p.BlockStride == q.BlockStride && p.SlotStride == q.SlotStride &&
			p.HeadStride == q.HeadStride && p.Offset == q.Offset+uint64(q.Width)*e {
			q.Width += p.Width
			q.Name += "+" + p.Name
			continue
		}
		parts = append(parts, p)
	}
	l.Parts = parts
	return l
}

// HeadsTogether reports whether every part keeps a token's held heads
// together (NHD: head stride equals the part's row): the layouts whose
// token-major stream is contiguous per token, which a backend moves with
// plain copies.
func (l *Layout) HeadsTogether() bool {
	e := l.DType.Size()
	for i := range l.Parts {
		p := &l.Parts[i]
		if l.Held() > 1 && p.HeadStride != uint64(p.Width)*e {
			return false
		}
	}
	return true
}

// HeadOuter reports whether every part keeps a head's tokens of a block
// together, heads outside them (HND, vLLM's packed K|V): the layouts that
// BlockMajor moves whole blocks of. Without parts it is false; with one
// head held, true (there is no head order to keep).
func (l *Layout) HeadOuter() bool {
	if len(l.Parts) == 0 {
		return false
	}
	for i := range l.Parts {
		p := &l.Parts[i]
		if l.Held() > 1 && p.HeadStride < p.SlotStride*uint64(l.BlockSize) {
			return false
		}
	}
	return true
}

// Held is the number of heads this rank holds.
func (l *Layout) Held() uint32 { return l.HeadHi - l.HeadLo }

// RowWidth is the logical row width in elements: the sum of the parts'.
func (l *Layout) RowWidth() uint64 {
	var w uint64
	for i := range l.Parts {
		w += uint64(l.Parts[i].Width)
	}
	return w
}

// NumTensors is one more than the highest tensor index the parts name.
func (l *Layout) NumTensors() int {
	n := 0
	for i := range l.Parts {
		if t := l.Parts[i].Tensor + 1; t > n {
			n = t
		}
	}
	return n
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("kvlayout: %w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Validate checks every rule of the model against the lengths in bytes of
// the layer's tensors (tensorLens[i] for tensor i): fields in range, every
// row inside its tensor, and no two rows (of any block, slot, head or part)
// sharing a byte. Errors name the field, its value and the limit it broke.
func (l *Layout) Validate(tensorLens []uint64) error {
	if err := l.validateShape(); err != nil {
		return err
	}
	if len(tensorLens) > MaxTensors {
		return invalid("%d tensors, above the limit %d", len(tensorLens), MaxTensors)
	}
	for i := range l.Parts {
		p := &l.Parts[i]
		if p.Tensor >= len(tensorLens) {
			return invalid("parts[%d].tensor %d, but only %d tensor lengths given", i, p.Tensor, len(tensorLens))
		}
		end, ok := l.partEnd(p)
		if !ok {
			return invalid("parts[%d] reaches past 2^64 bytes (offset %d, strides %d/%d/%d)", i, p.Offset, p.BlockStride, p.SlotStride, p.HeadStride)
		}
		if end > tensorLens[p.Tensor] {
			return invalid("parts[%d] (%q) reaches byte %d of tensor %d, which holds %d", i, p.Name, end, p.Tensor, tensorLens[p.Tensor])
		}
	}
	return l.checkOverlap()
}

// validateShape checks everything that does not need the tensors' lengths:
// what a Side needs to walk the layout without dividing by zero or
// indexing past a slice.
func (l *Layout) validateShape() error {
	switch {
	case !l.DType.Valid():
		return invalid("dtype %s unknown", l.DType)
	case l.BlockSize < 1:
		return invalid("block_size %d below the minimum 1", l.BlockSize)
	case l.Blocks < 1:
		return invalid("blocks %d below the minimum 1", l.Blocks)
	case l.Heads < 1:
		return invalid("heads %d below the minimum 1", l.Heads)
	case l.HeadLo >= l.HeadHi:
		return invalid("head_lo %d not below head_hi %d", l.HeadLo, l.HeadHi)
	case l.HeadHi > l.Heads:
		return invalid("head_hi %d above heads %d", l.HeadHi, l.Heads)
	case len(l.Parts) < 1:
		return invalid("%d parts, below the minimum 1", len(l.Parts))
	case len(l.Parts) > MaxParts:
		return invalid("%d parts, above the limit %d", len(l.Parts), MaxParts)
	}
	var w uint64
	for i := range l.Parts {
		p := &l.Parts[i]
		switch {
		case p.Width < 1:
			return invalid("parts[%d].width %d below the minimum 1", i, p.Width)
		case p.Tensor < 0 || p.Tensor >= MaxTensors:
			return invalid("parts[%d].tensor %d outside [0, %d)", i, p.Tensor, MaxTensors)
		case len(p.Name) > maxPartName:
			return invalid("parts[%d].name is %d bytes, above the limit %d", i, len(p.Name), maxPartName)
		case p.Name == packedKVName:
			return invalid("parts[%d].name %q: a packed K|V row is two parts, \"k\" and \"v\", at different offsets", i, p.Name)
		}
		w += uint64(p.Width)
	}
	if w > MaxRowWidth {
		return invalid("row width %d (sum of the parts' widths) above the limit %d", w, MaxRowWidth)
	}
	return nil
}

// partEnd is one past the highest byte any row of p touches.
func (l *Layout) partEnd(p *Part) (uint64, bool) {
	end := p.Offset
	for _, d := range l.dims(p) {
		s, ok := span(d.count, d.stride)
		if !ok {
			return 0, false
		}
		if end, ok = add(end, s); !ok {
			return 0, false
		}
	}
	rowBytes := uint64(p.Width) * l.DType.Size()
	return add(end, rowBytes)
}

// dim is one axis along which a part's rows repeat.
type dim struct {
	count, stride uint64
}

func (l *Layout) dims(p *Part) [3]dim {
	return [3]dim{
		{uint64(l.Blocks), p.BlockStride},
		{uint64(l.BlockSize), p.SlotStride},
		{uint64(l.Held()), p.HeadStride},
	}
}

// nested reports whether rows of rowBytes bytes placed at every point of
// the grid spanned by dims are pairwise disjoint, by a sufficient test:
// sorted by stride, each axis must step over everything the axes inside it
// cover. Axes of one item do not repeat and are skipped. This accepts every
// layout of the engines (NHD, HND, packed K|V, K/V per block) and refuses
// any zero stride on a repeated axis; it also refuses interleavings that
// would happen to be disjoint, which no engine uses. All products are
// bounded by the part's end, checked before.
func nested(rowBytes uint64, dims []dim) bool {
	var buf [4]dim
	ds := buf[:0]
	for _, d := range dims {
		if d.count > 1 {
			ds = append(ds, d)
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].stride < ds[j].stride })
	covered := rowBytes
	for _, d := range ds {
		if d.stride < covered {
			return false
		}
		s, ok := span(d.count, d.stride)
		if !ok {
			return false
		}
		if covered, ok = add(covered, s); !ok {
			return false
		}
	}
	return true
}

// checkOverlap refuses a layout in which two rows share a byte: rows of one
// part (by nested), and rows of two parts in the same tensor. Two parts are
// apart when their byte extents are disjoint (K and V in separate halves of
// a tensor), or when they have the same strides and the step between their
// offsets nests with the other axes like one more axis of two items (K and
// V side by side in one row or one block: packed K|V, FlashInfer).
func (l *Layout) checkOverlap() error {
	e := l.DType.Size()
	for i := range l.Parts {
		p := &l.Parts[i]
		d := l.dims(p)
		if !nested(uint64(p.Width)*e, d[:]) {
			return invalid("parts[%d] (%q): rows overlap (block_stride %d x %d, slot_stride %d x %d, head_stride %d x %d, row %d bytes)",
				i, p.Name, p.BlockStride, l.Blocks, p.SlotStride, l.BlockSize, p.HeadStride, l.Held(), uint64(p.Width)*e)
		}
	}
	for i := range l.Parts {
		for j := i + 1; j < len(l.Parts); j++ {
			if !l.partsApart(&l.Parts[i], &l.Parts[j]) {
				return invalid("parts[%d] (%q) and parts[%d] (%q) overlap in tensor %d", i, l.Parts[i].Name, j, l.Parts[j].Name, l.Parts[i].Tensor)
			}
		}
	}
	return nil
}

func (l *Layout) partsApart(a, b *Part) bool {
	if a.Tensor != b.Tensor {
		return true
	}
	if a.Offset > b.Offset {
		a, b = b, a
	}
	endA, _ := l.partEnd(a) // both ends were checked by Validate
	if endA <= b.Offset {
		return true
	}
	if a.BlockStride != b.BlockStride || a.SlotStride != b.SlotStride || a.HeadStride != b.HeadStride {
		return false
	}
	e := l.DType.Size()
	row := max(uint64(a.Width), uint64(b.Width)) * e
	d := l.dims(a)
	return nested(row, []dim{d[0], d[1], d[2], {2, b.Offset - a.Offset}})
}
