package staging

import (
	"fmt"
	"math"

	"github.com/stage-kv/stage/device"
)

// PlanOp is one contiguous range to move: from Src on the sending device to
// DstOff inside destination region DstRegion (an index the receiver resolves).
type PlanOp struct {
	Src       device.Addr
	DstRegion uint32
	DstOff    uint64
	Len       uint64
}

// DstSeg is where a piece of a chunk lands on the receiver.
type DstSeg struct {
	Region uint32
	Len    uint32
	Off    uint64
}

// Chunk is at most one slot of payload: the sender gathers Src into a slot,
// the receiver scatters the slot into Dst. Both lists cover Len bytes in order.
//
// A chunk of a mapped plan (NewMappedPlan) has no Src: its sources are
// bytes [Off, Off+Len) of the plan's stream, mapped by Sources where the
// copy is enqueued, so that the mapping (thousands of rows for a KV layout
// that keeps heads apart) runs beside the sender core, not inside it.
type Chunk struct {
	Len    uint32
	Src    []device.Seg
	Dst    []DstSeg
	Off    uint64
	gather GatherFunc
	runs   RunFunc
}

// HasRuns reports whether the chunk's sources come from SourceRuns.
func (c *Chunk) HasRuns() bool { return c.runs != nil }

// SourceRuns returns a mapped chunk's sources as strided runs appended to
// buf (HasRuns must hold): a backend with a strided kernel takes them as
// they are, one per block run where Sources gives a segment per row.
func (c *Chunk) SourceRuns(buf []device.Run) []device.Run {
	return c.runs(c.Off, c.Len, buf)
}

// Mapped reports whether the chunk's sources come from Sources (and, with
// HasRuns, SourceRuns).
func (c *Chunk) Mapped() bool { return c.gather != nil }

// Sources returns the chunk's source segments: Src, or for a mapped chunk
// its stream range mapped now, appended to buf. GatherFunc must be safe for
// concurrent use (kvlayout sides are).
func (c *Chunk) Sources(buf []device.Seg) []device.Seg {
	if c.gather == nil {
		return c.Src
	}
	return c.gather(c.Off, c.Len, buf)
}

// slabSegs is how many segments one allocation of a plan's segment slabs
// holds: chunks are cut into slabs of this size as they are needed, so
// cutting the first chunk of a huge transfer costs one small allocation.
const slabSegs = 4096

// Plan is a transfer cut into chunks of one slot each. Every chunk but the
// last carries exactly the chunk size (or, after SplitTail, every chunk
// before its tail, whose lengths are listed), so the number of chunks and
// each chunk's length are known at once; their segment lists are cut on
// demand, in order, the first time Chunk asks for them: the first chunk of
// a push of many scattered blocks can be gathered while the rest are still
// ops.
//
// A Plan is not safe for concurrent use: whoever holds it (the sender core,
// on its one goroutine) cuts it. A Chunk, once returned, never changes or
// moves, so it may be read by other goroutines (copies, writers) while later
// chunks are cut.
type Plan struct {
	Total uint64

	ops    []PlanOp
	have   uint64 // bytes of ops given: Total, except while a growing plan waits for more
	cs     uint64
	n      int
	chunks []Chunk // cut so far; capacity n, so pointers into it stay valid
	// After SplitTail: chunks from head on have the lengths in tail
	// (tail.go); nil: only the last chunk may be short.
	head int
	tail []uint32

	// The cursor: ops[op] is the next op to cut, done of its bytes are.
	op   int
	done uint64
	// Slabs the next chunk's segments are appended to; they hold no
	// earlier chunk's segments, so growing one copies only the chunk.
	src []device.Seg
	dst []DstSeg

	// A mapped plan (NewMappedPlan) has no ops: gather maps its stream
	// to source segments, and each chunk's one destination segment names
	// its offset in the stream.
	gather    GatherFunc
	runs      RunFunc
	dstRegion uint32
}

// GatherFunc appends to segs the source segments of bytes [off, off+n) of a
// mapped transfer's stream, in order, and returns the extended slice. It
// may be called from several goroutines at once.
type GatherFunc func(off uint64, n uint32, segs []device.Seg) []device.Seg

// RunFunc is GatherFunc for strided runs: it appends the runs of bytes
// [off, off+n) of a mapped transfer's stream to runs, in order.
type RunFunc func(off uint64, n uint32, runs []device.Run) []device.Run

// NewPlan checks ops (none empty, the total neither zero nor overflowing)
// and returns a plan that cuts them into chunks of at most chunkSize bytes
// as they are asked for: ops whose source and destination both continue the
// previous op merge into one segment, small ops share a chunk, and large
// ops are split across chunks. ops is kept, not copied: the caller must not
// change it while the plan is in use.
func NewPlan(ops []PlanOp, chunkSize int) (*Plan, error) {
	if chunkSize <= 0 || uint64(chunkSize) > math.MaxUint32 {
		return nil, fmt.Errorf("staging: chunk size %d outside 1 B to 4 GiB", chunkSize)
	}
	var total uint64
	for i := range ops {
		n := ops[i].Len
		if n == 0 {
			return nil, fmt.Errorf("staging: op %d has length 0", i)
		}
		if total+n < total {
			return nil, fmt.Errorf("staging: transfer length overflows")
		}
		total += n
	}
	if total == 0 {
		return nil, fmt.Errorf("staging: empty transfer")
	}
	cs := uint64(chunkSize)
	n := (total-1)/cs + 1
	if n > math.MaxUint32 {
		return nil, fmt.Errorf("staging: %d B in %d B chunks makes %d chunks, more than a transfer can count", total, cs, n)
	}
	return &Plan{Total: total, have: total, ops: ops, cs: cs, n: int(n), chunks: make([]Chunk, 0, n)}, nil
}

// NewGrowingPlan is a plan of total bytes whose ops come in pieces (a
// Submit sent in pieces, PROTOCOL.md 9.5b): ops given now, more later with
// Grow. Its chunk count is known at once, from total; Ready says how many
// chunks the ops given so far cover, and only those may be asked for.
func NewGrowingPlan(total uint64, chunkSize int, ops []PlanOp) (*Plan, error) {
	if total == 0 {
		return nil, fmt.Errorf("staging: empty transfer")
	}
	p, err := NewPlan([]PlanOp{{Len: total}}, chunkSize)
	if err != nil {
		return nil, err
	}
	p.ops, p.have = nil, 0
	return p, p.Grow(ops)
}

// Grow appends ops to a growing plan: none empty, and all ops given never
// more than Total bytes (on error nothing is appended). ops is kept, not
// copied.
func (p *Plan) Grow(ops []PlanOp) error {
	have := p.have
	for i := range ops {
		n := ops[i].Len
		if n == 0 {
			return fmt.Errorf("staging: op %d of a piece has length 0", i)
		}
		if n > p.Total-have {
			return fmt.Errorf("staging: the pieces' ops reach past the %d bytes the transfer declared", p.Total)
		}
		have += n
	}
	p.ops = append(p.ops, ops...)
	p.have = have
	return nil
}

// Complete reports whether the ops given add up to Total.
func (p *Plan) Complete() bool { return p.have == p.Total }

// Ready is how many chunks, from the first, the ops given so far cover:
// Len() once Complete.
func (p *Plan) Ready() int {
	if p.have == p.Total {
		return p.n
	}
	return int(p.have / p.cs)
}

// NewMappedPlan is a plan over a stream of total bytes whose source segments
// gather computes when each chunk is copied (Chunk.Sources; a KV transfer:
// the sender's layout mapped to the canonical order). Each chunk's destination is one segment
// of region dstRegion whose Off is the chunk's offset in the stream: the
// receiver maps it with its own layout.
func NewMappedPlan(total uint64, chunkSize int, dstRegion uint32, gather GatherFunc) (*Plan, error) {
	if total == 0 {
		return nil, fmt.Errorf("staging: empty transfer")
	}
	p, err := NewPlan([]PlanOp{{Len: total}}, chunkSize)
	if err != nil {
		return nil, err
	}
	p.ops, p.gather, p.dstRegion = nil, gather, dstRegion
	return p, nil
}

// NewMappedRunPlan is NewMappedPlan whose chunks also map to strided runs
// (Chunk.SourceRuns); gather maps the same bytes to segments.
func NewMappedRunPlan(total uint64, chunkSize int, dstRegion uint32, gather GatherFunc, runs RunFunc) (*Plan, error) {
	p, err := NewMappedPlan(total, chunkSize, dstRegion, gather)
	if err != nil {
		return nil, err
	}
	p.runs = runs
	return p, nil
}

// MakePlan is NewPlan with every chunk cut at once.
func MakePlan(ops []PlanOp, chunkSize int) (*Plan, error) {
	p, err := NewPlan(ops, chunkSize)
	if err != nil {
		return nil, err
	}
	p.Chunk(p.n - 1)
	return p, nil
}

// Len is the number of chunks.
func (p *Plan) Len() int { return p.n }

// ChunkLen is the payload length of chunk i, cut or not.
func (p *Plan) ChunkLen(i int) uint32 {
	if p.tail != nil && i >= p.head {
		return p.tail[i-p.head]
	}
	if i == p.n-1 {
		return uint32(p.Total - uint64(i)*p.cs)
	}
	return uint32(p.cs)
}

// Chunk returns chunk i (0 <= i < Ready()), cutting it and any chunk before
// it not cut yet.
func (p *Plan) Chunk(i int) *Chunk {
	for len(p.chunks) <= i {
		p.cut()
	}
	return &p.chunks[i]
}

// cut cuts the next chunk from the cursor.
func (p *Plan) cut() {
	if len(p.src) == cap(p.src) {
		p.src = make([]device.Seg, 0, p.slab())
	}
	if len(p.dst) == cap(p.dst) {
		p.dst = make([]DstSeg, 0, p.slab())
	}
	src, dst := p.src, p.dst
	want := p.ChunkLen(len(p.chunks))
	if p.gather != nil {
		off := p.offset(len(p.chunks))
		dst = append(dst, DstSeg{Region: p.dstRegion, Len: want, Off: off})
		p.chunks = append(p.chunks, Chunk{Len: want, Dst: dst[:len(dst):len(dst)], Off: off, gather: p.gather, runs: p.runs})
		p.dst = dst[len(dst):]
		return
	}
	var got uint32
	for got < want {
		op := &p.ops[p.op]
		n := min(op.Len-p.done, uint64(want-got))
		a, off := op.Src+device.Addr(p.done), op.DstOff+p.done
		// Merge with the previous segment of this chunk when both sides
		// continue it.
		if k := len(src) - 1; k >= 0 && src[k].Addr+device.Addr(src[k].Len) == a {
			src[k].Len += n
		} else {
			src = append(src, device.Seg{Addr: a, Len: n})
		}
		if k := len(dst) - 1; k >= 0 && dst[k].Region == op.DstRegion && dst[k].Off+uint64(dst[k].Len) == off {
			dst[k].Len += uint32(n)
		} else {
			dst = append(dst, DstSeg{Region: op.DstRegion, Len: uint32(n), Off: off})
		}
		got += uint32(n)
		p.done += n
		if p.done == op.Len {
			p.op++
			p.done = 0
		}
	}
	p.chunks = append(p.chunks, Chunk{Len: got, Src: src[:len(src):len(src)], Dst: dst[:len(dst):len(dst)]})
	// The rest of the slabs (or nothing, when a chunk outgrew them) is
	// where the next chunk goes.
	p.src, p.dst = src[len(src):], dst[len(dst):]
}

// slab is the size of a new segment slab: enough for what is left of the
// ops (each may start a segment, each chunk boundary cut one more), at
// most slabSegs.
func (p *Plan) slab() int {
	if p.gather != nil {
		return slabSegs
	}
	return min(slabSegs, len(p.ops)-p.op+p.n-len(p.chunks))
}
