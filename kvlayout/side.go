package kvlayout

import (
	"errors"
	"fmt"
	"slices"
)

// SideSpec is what one side of a KV transfer names about itself.
type SideSpec struct {
	Layout Layout
	// Regions[l][t] is the region (index into the caller's table of
	// regions, and into Gather's and Scatter's tensors) that holds tensor t
	// of the transfer's l-th layer. Every layer names every tensor of the
	// layout.
	Regions [][]int
	// Table is the request's block table: block ids in token order. The
	// Side keeps it (no copy); the caller must not change it while the
	// Side is in use.
	Table []uint32
	// FirstToken is where the transfer starts in the table's token space:
	// token t of the transfer lives in block Table[(FirstToken+t)/BlockSize]
	// at slot (FirstToken+t)%BlockSize.
	FirstToken uint64
	Tokens     uint64 // tokens the transfer moves
	// HeadLo and HeadHi are the heads the transfer moves: inside this
	// side's slice (and the peer's: Overlap, or a part of it).
	HeadLo, HeadHi uint32
	// Cols are the column ranges of the transfer, from Columns(here, peer).
	Cols []Col
	// Order is the canonical order both sides use (see Order).
	Order Order
	// Written marks the destination of the transfer: the blocks its
	// tokens use must all differ, or two token ranges would land in one
	// block (CheckDistinct). A source may name a block twice: reading it
	// twice is harmless.
	Written bool
}

// Order is the order of row pieces within a column of the canonical
// stream. Both sides of a transfer must use the same one.
type Order uint8

const (
	// TokenMajor: for each token, for each head. Layouts whose token's
	// heads lie together (NHD: vllm-ascend, vLLM flash) are contiguous in
	// it per block run, so a backend without kernels moves them with
	// plain copies; it is the order unless both sides qualify for
	// BlockMajor.
	TokenMajor Order = iota
	// BlockMajor: for each block of the transfer, for each head, for each
	// token of that block. Two layouts that keep a head's tokens together
	// (HND, vLLM's packed K|V) move whole blocks in it; it needs the same
	// block size on both sides and first tokens at the same place in a
	// block (BlockMajorFits), so both cut the tokens into the same blocks.
	BlockMajor
)

func (o Order) String() string {
	if o == BlockMajor {
		return "block-major"
	}
	return "token-major"
}

// BlockMajorFits reports whether two sides can use BlockMajor: each keeps
// a head's tokens together (HeadOuter), the block sizes match, and the
// transfer starts at the same slot of a block on both.
func BlockMajorFits(a, b Layout, firstA, firstB uint64) bool {
	return a.HeadOuter() && b.HeadOuter() && a.BlockSize == b.BlockSize && a.BlockSize > 0 &&
		firstA%uint64(a.BlockSize) == firstB%uint64(b.BlockSize)
}

// Side maps the canonical byte stream of one KV transfer onto one side's
// memory. Build it with NewSide; it is read-only afterwards and safe for
// concurrent use.
type Side struct {
	regions    [][]int
	table      []uint32
	first      uint64
	tokens     uint64
	heads      uint64 // heads the transfer moves
	blockSize  uint64
	cols       []colMap
	layerBytes uint64
	total      uint64
	order      Order
}

// colMap is everything Segments needs to place the rows of one column,
// computed once so that the walk does no lookups in the layout.
type colMap struct {
	start  uint64 // offset of the column's stream within a layer's bytes
	bytes  uint64 // tokens * heads * piece
	piece  uint64 // bytes of one row piece (column width * element size)
	tensor int
	// base is the address of the piece of block 0, slot 0 and the
	// transfer's first head: part offset, plus the column's offset inside
	// the part, plus the heads of this side's slice below the transfer's.
	base                uint64
	block, slot, head   uint64 // the part's strides
	headsRun, tokensRun bool   // see NewSide
	unit                uint64 // bytes of one token's heads when headsRun
}

// NewSide checks spec against its layout and prepares the mapping: the
// layout's shape, the regions of every layer, the columns (they must tile
// the row and each lie inside one part), the head range (inside the
// side's slice), the tokens (FirstToken+Tokens within the table's
// len(Table)*BlockSize tokens), every block id (below Blocks) and, when
// Written, that the blocks the transfer's tokens use differ. Its cost is
// one pass over the table, and one over the used blocks when Written.
func NewSide(spec SideSpec) (*Side, error) {
	l := &spec.Layout
	if err := l.validateShape(); err != nil {
		return nil, err
	}
	for i := range l.Parts {
		if _, ok := l.partEnd(&l.Parts[i]); !ok {
			return nil, invalid("parts[%d] reaches past 2^64 bytes", i)
		}
	}
	if err := checkRegions(spec.Regions, l.NumTensors()); err != nil {
		return nil, err
	}
	switch {
	case spec.HeadLo >= spec.HeadHi:
		return nil, invalid("transfer heads [%d, %d) empty", spec.HeadLo, spec.HeadHi)
	case spec.HeadLo < l.HeadLo || spec.HeadHi > l.HeadHi:
		return nil, invalid("transfer heads [%d, %d) outside this side's slice [%d, %d)", spec.HeadLo, spec.HeadHi, l.HeadLo, l.HeadHi)
	case spec.Tokens < 1:
		return nil, invalid("tokens %d below the minimum 1", spec.Tokens)
	}
	bs := uint64(l.BlockSize)
	capTokens, ok := mul(uint64(len(spec.Table)), bs)
	end, ok2 := add(spec.FirstToken, spec.Tokens)
	if !ok || !ok2 || end > capTokens {
		return nil, invalid("first_token %d + tokens %d exceeds the block table's %d blocks x %d tokens = %d",
			spec.FirstToken, spec.Tokens, len(spec.Table), bs, capTokens)
	}
	if err := checkTable(spec.Table, l.Blocks); err != nil {
		return nil, err
	}
	if spec.Written {
		if err := CheckDistinct(spec.Table, l.BlockSize, spec.FirstToken, spec.Tokens); err != nil {
			return nil, err
		}
	}
	if spec.Order > BlockMajor {
		return nil, invalid("order %d unknown", spec.Order)
	}
	s := &Side{
		regions: spec.Regions, table: spec.Table, first: spec.FirstToken, tokens: spec.Tokens,
		heads: uint64(spec.HeadHi - spec.HeadLo), blockSize: bs, order: spec.Order,
	}
	if err := s.mapColumns(l, spec.Cols, spec.HeadLo); err != nil {
		return nil, err
	}
	total, ok := mul(s.layerBytes, uint64(len(spec.Regions)))
	if !ok {
		return nil, invalid("%d layers of %d bytes: above 2^64 bytes", len(spec.Regions), s.layerBytes)
	}
	s.total = total
	return s, nil
}

// checkTable refuses a block id outside the layout. The largest id is
// found without a branch per entry (65,536 ids in tens of microseconds);
// the index is looked for only to name it in the error.
func checkTable(table []uint32, blocks uint32) error {
	if len(table) == 0 || tableMax(table) < blocks {
		return nil
	}
	for i, b := range table {
		if b >= blocks {
			return invalid("block_table[%d] = %d, outside the layout's %d blocks", i, b, blocks)
		}
	}
	return nil
}

// tableMax is the largest id of table (0 when empty).
func tableMax(table []uint32) uint32 {
	var t0, t1, t2, t3 uint32 // four chains: the loop is bound by max's latency
	i := 0
	for ; i+4 <= len(table); i += 4 {
		t0, t1, t2, t3 = max(t0, table[i]), max(t1, table[i+1]), max(t2, table[i+2]), max(t3, table[i+3])
	}
	for ; i < len(table); i++ {
		t0 = max(t0, table[i])
	}
	return max(t0, t1, t2, t3)
}

// CheckDistinct refuses a destination's block table that names one block
// twice among the blocks the transfer's tokens [first, first+tokens) use
// (blocks of blockSize tokens): two token ranges would land in that block
// and the last one win. Entries outside those blocks are not looked at.
// The error wraps ErrInvalid and ErrRepeatedBlock and names the id and the
// table positions of its first two uses. Its cost is one pass over the
// used entries and a bitmap of the largest id's bits (a sort of the
// entries instead where the ids are far sparser than the table), so a
// table of 65,536 ids takes tens of microseconds.
func CheckDistinct(table []uint32, blockSize uint32, first, tokens uint64) error {
	if tokens == 0 {
		return nil
	}
	end, ok := add(first, tokens)
	if blockSize == 0 || !ok || (end-1)/uint64(blockSize) >= uint64(len(table)) {
		return invalid("tokens [%d, %d) outside a block table of %d blocks x %d tokens", first, first+tokens, len(table), blockSize)
	}
	lo, hi := first/uint64(blockSize), (end-1)/uint64(blockSize)+1
	if j := firstRepeat(table[lo:hi]); j >= 0 {
		id := table[lo+uint64(j)]
		i := slices.Index(table[lo:], id)
		return fmt.Errorf("kvlayout: %w: %w: block_table[%d] and block_table[%d] are both block %d; a destination's blocks must differ (tokens [%d, %d) use entries %d to %d)",
			ErrInvalid, ErrRepeatedBlock, lo+uint64(i), lo+uint64(j), id, first, end, lo, hi-1)
	}
	return nil
}

// ErrRepeatedBlock is wrapped by CheckDistinct's refusal (and NewSide's of
// a Written side): a destination's block table names one block twice.
var ErrRepeatedBlock = errors.New("repeated destination block")

// firstRepeat is the smallest j such that used[j] occurs in used[:j], or -1.
func firstRepeat(used []uint32) int {
	n := len(used)
	if n < 2 {
		return -1
	}
	if words := uint64(tableMax(used))/64 + 1; words <= 2*uint64(n)+1024 {
		seen := make([]uint64, words)
		for j, b := range used {
			w, bit := b/64, uint64(1)<<(b%64)
			if seen[w]&bit != 0 {
				return j
			}
			seen[w] |= bit
		}
		return -1
	}
	// Sparse ids: sort (id, position) pairs. A pair whose id its
	// predecessor has is a repeat; the earliest of them is the answer.
	pairs := make([]uint64, n)
	for j, b := range used {
		pairs[j] = uint64(b)<<32 | uint64(j) // a table has fewer than 2^32 entries (the wire's counts are uint32)
	}
	slices.Sort(pairs)
	first := -1
	for k := 1; k < n; k++ {
		if pairs[k]>>32 == pairs[k-1]>>32 {
			if j := int(uint32(pairs[k])); first < 0 || j < first {
				first = j
			}
		}
	}
	return first
}

func checkRegions(regions [][]int, tensors int) error {
	if len(regions) < 1 {
		return invalid("%d layers, below the minimum 1", len(regions))
	}
	for i, r := range regions {
		if len(r) != tensors {
			return invalid("layer %d names %d regions, the layout has %d tensors", i, len(r), tensors)
		}
		for j, id := range r {
			if id < 0 {
				return invalid("layer %d tensor %d: region %d is negative", i, j, id)
			}
		}
	}
	return nil
}

// mapColumns checks that the columns tile the row, each inside one part,
// and computes where each column's pieces lie.
func (s *Side) mapColumns(l *Layout, cols []Col, headLo uint32) error {
	if len(cols) < 1 || len(cols) > 2*MaxParts {
		return invalid("%d columns, want 1 to %d", len(cols), 2*MaxParts)
	}
	e := l.DType.Size()
	s.cols = make([]colMap, len(cols))
	var at uint32
	pi, pStart := 0, uint32(0) // current part and its first column
	for i, c := range cols {
		if c.Lo != at || c.Hi <= c.Lo {
			return invalid("cols[%d] = [%d, %d); want a nonempty range starting at %d", i, c.Lo, c.Hi, at)
		}
		for pi < len(l.Parts) && c.Lo >= pStart+l.Parts[pi].Width {
			pStart += l.Parts[pi].Width
			pi++
		}
		if pi == len(l.Parts) || c.Hi > pStart+l.Parts[pi].Width {
			return invalid("cols[%d] = [%d, %d) crosses a part boundary of this side (or the row's end, %d)", i, c.Lo, c.Hi, l.RowWidth())
		}
		p := &l.Parts[pi]
		m := &s.cols[i]
		m.piece = uint64(c.Hi-c.Lo) * e
		m.bytes = s.tokens * s.heads * m.piece // at most layerBytes, checked below
		m.tensor = p.Tensor
		m.base = p.Offset + uint64(c.Lo-pStart)*e + uint64(headLo-l.HeadLo)*p.HeadStride
		m.block, m.slot, m.head = p.BlockStride, p.SlotStride, p.HeadStride
		m.headsRun = s.heads == 1 || m.head == m.piece
		m.unit = s.heads * m.piece
		m.tokensRun = m.headsRun && (m.slot == m.unit || s.blockSize == 1)
		at = c.Hi
	}
	if uint64(at) != l.RowWidth() {
		return invalid("columns end at %d, the row is %d wide", at, l.RowWidth())
	}
	rowBytes := l.RowWidth() * e
	perToken, ok := mul(s.heads, rowBytes)
	if ok {
		s.layerBytes, ok = mul(perToken, s.tokens)
	}
	if !ok {
		return invalid("%d tokens x %d heads x %d bytes: above 2^64 bytes", s.tokens, s.heads, rowBytes)
	}
	var start uint64
	for i := range s.cols {
		s.cols[i].start = start
		start += s.cols[i].bytes
	}
	return nil
}

// Len is the length of the transfer's canonical byte stream:
// layers x tokens x heads x row width x element size.
func (s *Side) Len() uint64 { return s.total }

// Layers is the number of layers the transfer moves.
func (s *Side) Layers() int { return len(s.regions) }

func (s *Side) String() string {
	return fmt.Sprintf("kv side: %d layers, %d tokens from %d, %d heads, %d columns, %d bytes", len(s.regions), s.tokens, s.first, s.heads, len(s.cols), s.total)
}
