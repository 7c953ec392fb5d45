package kvlayout

import "fmt"

// Role says what one dimension of a tensor indexes.
type Role uint8

// Roles of a tensor's dimensions. Every tensor needs Channel and either
// Block and Slot or Token; Head and Part are optional (absent: one head,
// or one part per tensor). A dimension of size 1 may have RoleNone.
const (
	RoleNone    Role = iota // a dimension of size 1 that indexes nothing
	RoleBlock               // block id
	RoleSlot                // token slot within a block
	RoleToken               // token in a flat pool (SGLang): block = token / BlockSize
	RoleHead                // held kv head
	RolePart                // selects the part (K/V): its size is the number of parts
	RoleChannel             // element within a row; the parts split it unless RolePart is present
	roleEnd
)

var roleNames = [roleEnd]string{"none", "block", "slot", "token", "head", "part", "channel"}

func (r Role) String() string {
	if r < roleEnd {
		return roleNames[r]
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// PartSpec names one part a tensor holds and its width in elements.
type PartSpec struct {
	Name  string
	Width uint32
}

// Tensor describes one tensor of a layer as torch gives it: its shape, its
// strides in elements (tensor.stride()), what each dimension indexes, and
// the parts it holds in logical order. The tensor's first element
// (data_ptr) is the start of its region.
type Tensor struct {
	Shape   []int64
	Strides []int64
	Roles   []Role
	Parts   []PartSpec
}

// Params are what a layout needs beyond tensor shapes: the model's heads
// and this rank's slice of them, and for presets the sizes the tensors are
// built from. HeadHi 0 means every head from HeadLo on; Heads 0 means 1
// (MLA).
type Params struct {
	DType     DType
	Blocks    uint32
	BlockSize uint32 // tokens per block; for RoleToken tensors the page size
	Heads     uint32
	HeadLo    uint32
	HeadHi    uint32
	HeadSize  uint32   // elements per K (and per V) row, for non-MLA presets
	Widths    []uint32 // MLA: kv_lora_rank and rope_dim; default 512, 64
}

// FromStrides builds a layout from the tensors of one layer, tensor i being
// region i, and returns it with the byte lengths the tensors span. Blocks,
// block size and held heads come from the shapes and must agree across
// tensors; p gives dtype, total heads and HeadLo (and BlockSize for
// RoleToken tensors, and HeadHi when set, which must match the head
// dimension). The layout returned has passed Validate.
func FromStrides(p Params, tensors ...Tensor) (Layout, []uint64, error) {
	l := Layout{DType: p.DType, Heads: p.Heads, HeadLo: p.HeadLo}
	if l.Heads == 0 {
		l.Heads = 1
	}
	if !p.DType.Valid() {
		return Layout{}, nil, invalid("dtype %s unknown", p.DType)
	}
	if len(tensors) < 1 || len(tensors) > MaxTensors {
		return Layout{}, nil, invalid("%d tensors, want 1 to %d", len(tensors), MaxTensors)
	}
	lens := make([]uint64, len(tensors))
	for i := range tensors {
		g, err := readTensor(&tensors[i], p.BlockSize, p.DType.Size())
		if err != nil {
			return Layout{}, nil, fmt.Errorf("tensor %d: %w", i, err)
		}
		if i == 0 {
			l.Blocks, l.BlockSize, l.HeadHi = g.blocks, g.blockSize, l.HeadLo+g.held
		} else if g.blocks != l.Blocks || g.blockSize != l.BlockSize || l.HeadLo+g.held != l.HeadHi {
			return Layout{}, nil, invalid("tensor %d holds %d blocks of %d tokens and %d heads, tensor 0 %d blocks of %d tokens and %d heads",
				i, g.blocks, g.blockSize, g.held, l.Blocks, l.BlockSize, l.Held())
		}
		for _, gp := range g.parts {
			gp.Tensor = i
			l.Parts = append(l.Parts, gp)
		}
		lens[i] = g.bytes
	}
	if p.HeadHi != 0 && p.HeadHi != l.HeadHi {
		return Layout{}, nil, invalid("head_hi %d, but head_lo %d plus the %d heads of the head dimension is %d", p.HeadHi, l.HeadLo, l.Held(), l.HeadHi)
	}
	if err := l.Validate(lens); err != nil {
		return Layout{}, nil, err
	}
	return l, lens, nil
}

// geometry is what readTensor learns from one tensor.
type geometry struct {
	blocks, blockSize, held uint32
	parts                   []Part
	bytes                   uint64
}

// readTensor maps one tensor's dimensions onto the layout's strides.
func readTensor(t *Tensor, tokenBlock uint32, esize uint64) (geometry, error) {
	var g geometry
	n := len(t.Shape)
	if n == 0 || len(t.Strides) != n || len(t.Roles) != n {
		return g, invalid("shape has %d dims, strides %d, roles %d; want the same nonzero count", n, len(t.Strides), len(t.Roles))
	}
	var size, stride [roleEnd]uint64
	var seen [roleEnd]bool
	last := uint64(0) // element index of the last element
	for d := 0; d < n; d++ {
		r := t.Roles[d]
		sh, st := t.Shape[d], t.Strides[d]
		switch {
		case r >= roleEnd:
			return g, invalid("dim %d: role %s unknown", d, r)
		case sh < 1 || sh > 1<<32:
			return g, invalid("dim %d (%s): size %d outside [1, 2^32]", d, r, sh)
		case st < 0:
			return g, invalid("dim %d (%s): stride %d is negative", d, r, st)
		case r == RoleNone && sh != 1:
			return g, invalid("dim %d: size %d with no role; only dims of size 1 may have none", d, sh)
		case r != RoleNone && seen[r]:
			return g, invalid("dim %d: role %s given twice", d, r)
		}
		seen[r] = true
		size[r], stride[r] = uint64(sh), uint64(st)
		s, ok := span(uint64(sh), uint64(st))
		if last, ok = addOK(last, s, ok); !ok {
			return g, invalid("dim %d (%s): tensor spans past 2^64 elements", d, r)
		}
	}
	bytes, ok := mul(last+1, esize)
	if !ok || last == ^uint64(0) {
		return g, invalid("tensor spans past 2^64 bytes")
	}
	g.bytes = bytes
	if !seen[RoleChannel] {
		return g, invalid("no dim has role channel")
	}
	if stride[RoleChannel] != 1 && size[RoleChannel] > 1 {
		return g, invalid("channel stride %d; a row's elements must be contiguous (stride 1)", stride[RoleChannel])
	}
	if err := g.blockAxes(seen, size, stride, tokenBlock); err != nil {
		return g, err
	}
	g.held = 1
	if seen[RoleHead] {
		g.held = uint32(min(size[RoleHead], 1<<32-1))
	}
	return g, g.splitParts(t.Parts, seen[RolePart], size, stride, esize)
}

func addOK(a, b uint64, ok bool) (uint64, bool) {
	if !ok {
		return 0, false
	}
	return add(a, b)
}

// blockAxes sets blocks and block size from Block and Slot, or from a flat
// Token axis cut into blocks of tokenBlock tokens. Strides are kept in
// elements here and scaled to bytes by splitParts.
func (g *geometry) blockAxes(seen [roleEnd]bool, size, stride [roleEnd]uint64, tokenBlock uint32) error {
	switch {
	case seen[RoleToken] && (seen[RoleBlock] || seen[RoleSlot]):
		return invalid("role token together with block or slot; give one or the other")
	case seen[RoleToken]:
		if tokenBlock < 1 {
			return invalid("block_size %d for a token dimension; want the page size", tokenBlock)
		}
		if size[RoleToken]%uint64(tokenBlock) != 0 || size[RoleToken]/uint64(tokenBlock) > 1<<32-1 {
			return invalid("token dim of %d tokens is not a whole number of blocks of %d (below 2^32)", size[RoleToken], tokenBlock)
		}
		g.blocks, g.blockSize = uint32(size[RoleToken]/uint64(tokenBlock)), tokenBlock
	case seen[RoleBlock] && seen[RoleSlot]:
		if size[RoleBlock] > 1<<32-1 || size[RoleSlot] > 1<<32-1 {
			return invalid("block dim %d or slot dim %d above 2^32-1", size[RoleBlock], size[RoleSlot])
		}
		g.blocks, g.blockSize = uint32(size[RoleBlock]), uint32(size[RoleSlot])
	default:
		return invalid("no block and slot dims (or token dim)")
	}
	return nil
}

// splitParts turns the Part axis, or the channel axis cut at the parts'
// widths, into the layout's parts.
func (g *geometry) splitParts(specs []PartSpec, hasPartDim bool, size, stride [roleEnd]uint64, esize uint64) error {
	if len(specs) < 1 || len(specs) > MaxParts {
		return invalid("%d parts named, want 1 to %d", len(specs), MaxParts)
	}
	slot := stride[RoleSlot]
	block := stride[RoleBlock]
	if size[RoleToken] > 0 {
		slot = stride[RoleToken]
		// Wraps only when the pool holds one block, whose block stride no
		// address uses; with two or more it is below the tensor's span.
		block = stride[RoleToken] * uint64(g.blockSize)
	}
	base := Part{BlockStride: block * esize, SlotStride: slot * esize, HeadStride: stride[RoleHead] * esize}
	channels := size[RoleChannel]
	if hasPartDim && size[RolePart] != uint64(len(specs)) {
		return invalid("part dim of size %d, but %d parts named", size[RolePart], len(specs))
	}
	var at uint64
	for i, s := range specs {
		p := base
		p.Name, p.Width = s.Name, s.Width
		if hasPartDim {
			if uint64(s.Width) != channels {
				return invalid("parts[%d].width %d, but the channel dim holds %d", i, s.Width, channels)
			}
			p.Offset = uint64(i) * stride[RolePart] * esize
		} else {
			p.Offset = at * esize
			at += uint64(s.Width)
		}
		g.parts = append(g.parts, p)
	}
	if !hasPartDim && at != channels {
		return invalid("parts' widths sum to %d, but the channel dim holds %d", at, channels)
	}
	return nil
}
