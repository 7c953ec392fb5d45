package staging

import (
	"fmt"

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
type Chunk struct {
	Len uint32
	Src []device.Seg
	Dst []DstSeg
}

// Plan is a transfer cut into chunks.
type Plan struct {
	Chunks []Chunk
	Total  uint64
}

// MakePlan cuts ops into chunks of at most chunkSize bytes. Ops whose source
// and destination both continue the previous op are merged into one segment;
// small ops share a chunk; large ops are split across chunks. Segment slices
// of all chunks share two backing arrays, so a plan costs three allocations.
func MakePlan(ops []PlanOp, chunkSize int) (*Plan, error) {
	if chunkSize <= 0 {
		return nil, fmt.Errorf("staging: chunk size %d", chunkSize)
	}
	cs := uint64(chunkSize)
	var total uint64
	for i, op := range ops {
		if op.Len == 0 {
			return nil, fmt.Errorf("staging: op %d has length 0", i)
		}
		if total+op.Len < total {
			return nil, fmt.Errorf("staging: transfer length overflows")
		}
		total += op.Len
	}
	if total == 0 {
		return nil, fmt.Errorf("staging: empty transfer")
	}
	nchunks := int((total + cs - 1) / cs)
	// Upper bound on segments: every op may start a segment, and every
	// chunk boundary may cut one more.
	maxSegs := len(ops) + nchunks
	src := make([]device.Seg, 0, maxSegs)
	dst := make([]DstSeg, 0, maxSegs)
	p := &Plan{Chunks: make([]Chunk, 0, nchunks), Total: total}

	var cur Chunk
	srcStart, dstStart := 0, 0
	flush := func() {
		cur.Src = src[srcStart:len(src):len(src)]
		cur.Dst = dst[dstStart:len(dst):len(dst)]
		p.Chunks = append(p.Chunks, cur)
		cur = Chunk{}
		srcStart, dstStart = len(src), len(dst)
	}
	for _, op := range ops {
		a, off, left := op.Src, op.DstOff, op.Len
		for left > 0 {
			room := cs - uint64(cur.Len)
			n := min(left, room)
			// Merge with the previous segment of this chunk when both
			// sides continue it.
			if k := len(src) - 1; k >= srcStart && src[k].Addr+device.Addr(src[k].Len) == a {
				src[k].Len += n
			} else {
				src = append(src, device.Seg{Addr: a, Len: n})
			}
			if k := len(dst) - 1; k >= dstStart && dst[k].Region == op.DstRegion && dst[k].Off+uint64(dst[k].Len) == off {
				dst[k].Len += uint32(n)
			} else {
				dst = append(dst, DstSeg{Region: op.DstRegion, Len: uint32(n), Off: off})
			}
			cur.Len += uint32(n)
			a += device.Addr(n)
			off += n
			left -= n
			if uint64(cur.Len) == cs {
				flush()
			}
		}
	}
	if cur.Len > 0 {
		flush()
	}
	return p, nil
}
