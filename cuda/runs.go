package cuda

import (
	"fmt"
	"math/bits"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

// GatherRuns enqueues a copy of runs, in order, into dst contiguously
// (device.RunCopier). With the strided kernel each run is written
// straight as strided descriptors: no segment list is built, checked or
// compressed. Runs of one piece only, and devices without the kernel or
// not in kernel mode, take Gather's path with the runs expanded. runs may
// be reused when GatherRuns returns.
func (s *Stream) GatherRuns(dst device.Pinned, runs []device.Run) error {
	return s.moveRuns(true, dst, runs)
}

// ScatterRuns enqueues a copy of src, contiguously, into runs (see
// GatherRuns).
func (s *Stream) ScatterRuns(runs []device.Run, src device.Pinned) error {
	return s.moveRuns(false, src, runs)
}

func (s *Stream) moveRuns(gather bool, p device.Pinned, runs []device.Run) error {
	total, strided, err := checkRuns(runs)
	if err != nil {
		return fmt.Errorf("cuda: %s: %sRuns: %w", s.d, vendorkit.OpName(gather), err)
	}
	if total != uint64(p.Len()) {
		return fmt.Errorf("cuda: %s: %sRuns: runs add up to %d B, pinned buffer is %d B", s.d, vendorkit.OpName(gather), total, p.Len())
	}
	if !strided || s.d.fnStrided == nil || s.d.mode != CopyKernel || p.DeviceAddr() == 0 {
		// Whole segments (a contiguous layout's block runs) keep the
		// plain path and its figures.
		return s.move(gather, p, device.AppendRunSegs(make([]device.Seg, 0, len(runs)), runs))
	}
	if err := s.gate.Enter(&s.d.core, vendorkit.OpName(gather)+"Runs"); err != nil {
		return err
	}
	defer s.gate.Leave()
	ri, cur, pinned := 0, runCursor{}, uint64(p.DeviceAddr())
	return s.kernelRun(vendorkit.DirName(gather)+" runs",
		func() bool { return ri < len(runs) },
		func(sl *ringSlot) (int, bool) {
			n := 0
			for ; n < len(sl.strided) && ri < len(runs); n++ {
				var last bool
				sl.strided[n], last = cur.next(&runs[ri], pinned, gather, s.d.stridedMax)
				d := &sl.strided[n]
				pinned += uint64(d.len) * uint64(d.n1) * uint64(d.n2)
				if last {
					ri, cur = ri+1, runCursor{}
				}
			}
			s.stridedLaunches++
			return n, true
		})
}

// checkRuns refuses an empty dimension and a run whose bytes or extent
// pass 2^64, and returns the runs' bytes and whether any has more than
// one piece.
func checkRuns(runs []device.Run) (total uint64, strided bool, err error) {
	for i, r := range runs {
		if r.Len == 0 || r.N1 == 0 || r.N2 == 0 {
			return 0, false, fmt.Errorf("run %d (%#x: %d x %d pieces of %d B) is empty", i, r.Addr, r.N2, r.N1, r.Len)
		}
		hi, bytes := bits.Mul64(uint64(r.Len)*uint64(r.N1), uint64(r.N2))
		h2, rows := bits.Mul64(uint64(r.N2-1), r.S2)
		h1, cols := bits.Mul64(uint64(r.N1-1), r.S1)
		end, c1 := bits.Add64(uint64(r.Addr), rows, 0)
		end, c2 := bits.Add64(end, cols, 0)
		_, c3 := bits.Add64(end, uint64(r.Len), 0)
		var c4 uint64
		total, c4 = bits.Add64(total, bytes, 0)
		if hi|h2|h1|c1|c2|c3|c4 != 0 {
			return 0, false, fmt.Errorf("run %d (%#x: %d rows %d B apart of %d pieces %d B apart, %d B each) overflows", i, r.Addr, r.N2, r.S2, r.N1, r.S1, r.Len)
		}
		strided = strided || r.N1 > 1 || r.N2 > 1
	}
	return total, strided, nil
}

// runCursor is where the next descriptor of a run starts: row i2, piece
// i1, byte b of that piece.
type runCursor struct {
	i2, i1 uint32
	b      uint64
}

// next cuts the next descriptor of r, at most max bytes, whose slot side
// starts at pinned: whole rows while a row fits max, else pieces of one
// row while a piece does, else one piece in max-byte parts. It reports
// whether the descriptor is r's last.
func (c *runCursor) next(r *device.Run, pinned uint64, gather bool, max uint64) (sdesc, bool) {
	l := uint64(r.Len)
	dev := uint64(r.Addr) + uint64(c.i2)*r.S2 + uint64(c.i1)*r.S1
	var d sdesc
	switch {
	case c.b > 0 || l > max:
		n := min(l-c.b, max)
		d = sdesc{len: uint32(n), n1: 1, n2: 1}
		dev += c.b
		if c.b += n; c.b == l {
			c.b = 0
			c.stepPiece(r, 1)
		}
	case c.i1 > 0 || l*uint64(r.N1) > max:
		k := min(uint64(r.N1-c.i1), max/l)
		d = sdesc{len: r.Len, n1: uint32(k), n2: 1}
		c.stepPiece(r, uint32(k))
	default:
		k := min(uint64(r.N2-c.i2), max/(l*uint64(r.N1)))
		d = sdesc{len: r.Len, n1: r.N1, n2: uint32(k)}
		c.i2 += uint32(k)
	}
	var s1, s2, sl1, sl2 uint64
	if d.n1 > 1 {
		s1, sl1 = r.S1, uint64(d.len)
	}
	if d.n2 > 1 {
		s2, sl2 = r.S2, uint64(d.len)*uint64(d.n1)
	}
	if gather {
		d.src, d.src1, d.src2, d.dst, d.dst1, d.dst2 = dev, s1, s2, pinned, sl1, sl2
	} else {
		d.dst, d.dst1, d.dst2, d.src, d.src1, d.src2 = dev, s1, s2, pinned, sl1, sl2
	}
	return d, c.i2 == r.N2
}

// stepPiece moves the cursor k pieces on along its row (k never passes
// the row's end), to the next row at the end.
func (c *runCursor) stepPiece(r *device.Run, k uint32) {
	if c.i1 += k; c.i1 == r.N1 {
		c.i1, c.i2 = 0, c.i2+1
	}
}
