package device

// Run is a strided range of device memory: N2 rows of N1 pieces of Len
// bytes, piece (i2, i1) at Addr + i2*S2 + i1*S1. Its slot side is
// contiguous, pieces in row-major order, Len*N1*N2 bytes. A KV layout that
// keeps heads apart (vLLM's HND) is one Run per run of tokens in a block
// where it would be thousands of Segs, so a mapper emits Runs and a
// backend with a strided kernel takes them as they are.
type Run struct {
	Addr Addr
	Len  uint32 // bytes per piece
	N1   uint32 // pieces per row
	S1   uint64 // address step between pieces of a row
	N2   uint32 // rows
	S2   uint64 // address step between rows
}

// Bytes is the run's length on the slot side. Three factors below 2^32
// may exceed 2^64: a backend validating runs from elsewhere checks the
// product itself (bits.Mul64).
func (r Run) Bytes() uint64 { return uint64(r.Len) * uint64(r.N1) * uint64(r.N2) }

// RunCopier is implemented by streams that copy Runs without expanding
// them into segments (a strided kernel). Runs may be reused when the call
// returns. Callers without it expand with AppendRunSegs.
type RunCopier interface {
	// GatherRuns enqueues a copy of runs, in order, into dst contiguously.
	GatherRuns(dst Pinned, runs []Run) error
	// ScatterRuns enqueues a copy of src, contiguously, into runs.
	ScatterRuns(runs []Run, src Pinned) error
}

// AppendRunSegs appends the pieces of runs to segs in order, merging a
// piece into the segment before it when it continues it in memory, and
// returns the extended slice.
func AppendRunSegs(segs []Seg, runs []Run) []Seg {
	for _, r := range runs {
		if r.Len == 0 {
			continue
		}
		n := uint64(r.Len)
		for i2 := uint32(0); i2 < r.N2; i2++ {
			a := r.Addr + Addr(uint64(i2)*r.S2)
			for i1 := uint32(0); i1 < r.N1; i1++ {
				if k := len(segs) - 1; k >= 0 && segs[k].Addr+Addr(segs[k].Len) == a {
					segs[k].Len += n
				} else {
					segs = append(segs, Seg{Addr: a, Len: n})
				}
				a += Addr(r.S1)
			}
		}
	}
	return segs
}
