package cuda

import "github.com/stage-kv/stage/device"

// sdesc is one strided descriptor for the strided copy kernel; it matches
// StageStrided in kernels/gather.cu (64 bytes): n2 rows of n1 pieces of
// len bytes, piece (i2, i1) at src + i2*src2 + i1*src1 (dst likewise).
// Strides of a dimension of one piece or row are 0.
type sdesc struct {
	src, dst       uint64
	src1, dst1     uint64
	src2, dst2     uint64
	len, n1, n2, _ uint32
}

// DefaultStridedMaxBytes caps the bytes of one strided descriptor unless
// Config.StridedMaxBytes says otherwise: a descriptor is one thread block's
// work, so the cap keeps a chunk spread over enough blocks (a 4 MiB chunk
// is at least 128 descriptors).
const DefaultStridedMaxBytes = 32 << 10

// stridedMinRatio: a launch uses the strided kernel only when its
// descriptors carry at least this many pieces each on average; lists that
// barely compress (scattered 16 KiB blocks, two of which always make a
// "run") keep the plain kernel and its measured figures.
const stridedMinRatio = 4

// row is a run of pieces of one length whose device addresses step by s1
// (n >= 2), the slot side contiguous from slot. next is where the piece
// continuing it must be.
type row struct {
	dev, slot, len uint64
	n, s1, next    uint64
	fit            uint64 // pieces a descriptor may hold: max / len
}

// grid is rows of one shape whose starts step by s2.
type grid struct {
	row
	rows, s2 uint64
}

func boolU(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// compressor turns a segment list into strided descriptors in one pass,
// on two levels: each piece extends the current row while its address
// continues the row's stride (so a row ends where the layout's row ends,
// whatever came before it), and each finished row joins the current grid
// if it has the grid's shape and starts where the grid's next row would.
type compressor struct {
	out    []sdesc
	n      int
	gather bool
	max    uint64 // bytes per descriptor at most
	cur    row    // cur.len == 0: none
	g      grid   // g.len == 0: none

	fitLen, fit uint64 // c.max / fitLen
}

// add appends the piece [dev, dev+n) (0 < n <= c.max), whose slot bytes
// follow the previous piece's. It emits at most one descriptor.
func (c *compressor) add(dev, n, slot uint64) {
	r := &c.cur
	if n == r.len {
		switch {
		case r.n == 1 && dev != r.dev && r.fit >= 2:
			r.n, r.s1, r.next = 2, dev-r.dev, 2*dev-r.dev
			return
		case r.n > 1 && dev == r.next && r.n < r.fit:
			r.n++
			r.next += r.s1
			return
		}
	}
	if r.len != 0 {
		c.push()
	}
	if n != c.fitLen { // a division is dear next to the rest of a piece's work
		c.fitLen, c.fit = n, c.max/n
	}
	// Field by field: a struct literal is copied with wide moves, which
	// stall reading back the narrow stores just made (store forwarding).
	r.dev, r.slot, r.len, r.n, r.s1, r.next, r.fit = dev, slot, n, 1, 0, 0, c.fit
}

// push moves the finished row into the grid, emitting the grid first if
// the row does not continue it.
func (c *compressor) push() {
	r, g := &c.cur, &c.g
	if g.len == r.len && g.n == r.n && g.s1 == r.s1 && (g.rows+1)*g.n <= g.fit {
		switch d := r.dev - g.dev; {
		case g.rows == 1 && d != 0:
			g.rows, g.s2 = 2, d
			return
		case g.rows > 1 && r.dev == g.dev+g.rows*g.s2:
			g.rows++
			return
		}
	}
	c.emitGrid()
	g.dev, g.slot, g.len, g.n, g.s1, g.next, g.fit = r.dev, r.slot, r.len, r.n, r.s1, r.next, r.fit
	g.rows, g.s2 = 1, 0
}

func (c *compressor) emitGrid() {
	g := &c.g
	if g.len == 0 {
		return
	}
	s1, s2 := g.s1, g.s2
	if g.n == 1 {
		s1 = 0
	}
	if g.rows == 1 {
		s2 = 0
	}
	n := g.len
	d := sdesc{len: uint32(n), n1: uint32(g.n), n2: uint32(g.rows)}
	sl1, sl2 := n*boolU(g.n > 1), n*g.n*boolU(g.rows > 1)
	if c.gather {
		d.src, d.src1, d.src2, d.dst, d.dst1, d.dst2 = g.dev, s1, s2, g.slot, sl1, sl2
	} else {
		d.dst, d.dst1, d.dst2, d.src, d.src1, d.src2 = g.dev, s1, s2, g.slot, sl1, sl2
	}
	c.out[c.n] = d
	c.n++
	g.len = 0
}

func (c *compressor) flush() {
	if c.cur.len != 0 {
		c.push()
		c.cur = row{}
	}
	c.emitGrid()
}

// compressSegs writes strided descriptors for segs, from segment si at
// byte so on, into out until out is (nearly) full or segs end. Segments
// longer than maxLen are cut into maxLen pieces; consecutive pieces of one
// length whose device addresses step by a constant stride become one row,
// rows of one shape whose starts step by a constant stride one descriptor,
// at most maxLen bytes each. pinned is the slot-side device address of
// segs[si] at so; gather puts the slot side in dst, scatter in src. It
// returns the descriptors written, the pieces they hold and where to go
// on. out must hold at least 3 descriptors.
func compressSegs(out []sdesc, segs []device.Seg, si int, so, pinned uint64, gather bool, maxLen uint64) (n, pieces, nextSeg int, nextOff, nextPinned uint64) {
	c := compressor{out: out, gather: gather, max: maxLen}
	// One piece emits at most one descriptor and the flush two more.
	for si < len(segs) && c.n+3 <= len(out) {
		// Fast path: whole segments continuing the current row, in a
		// tight loop (most pieces of a strided layout go here).
		r := &c.cur
		if a := uint64(segs[si].Addr); so == 0 && r.n == 1 && segs[si].Len == r.len && a != r.dev && r.fit >= 2 {
			r.n, r.s1, r.next = 2, a-r.dev, 2*a-r.dev // the row's second piece sets its stride
			pieces++
			pinned += r.len
			si++
			continue
		}
		if so == 0 && r.n > 1 {
			k, m, next := si, r.n, r.next
			for k < len(segs) && m < r.fit && segs[k].Len == r.len && uint64(segs[k].Addr) == next {
				m++
				next += r.s1
				k++
			}
			if k > si {
				pieces += k - si
				pinned += uint64(k-si) * r.len
				r.n, r.next, si = m, next, k
				continue
			}
		}
		s := segs[si]
		if so >= s.Len { // an empty segment
			si, so = si+1, 0
			continue
		}
		l := min(s.Len-so, maxLen)
		c.add(uint64(s.Addr)+so, l, pinned)
		pieces++
		so += l
		pinned += l
		if so == s.Len {
			si, so = si+1, 0
		}
	}
	c.flush()
	for si < len(segs) && so >= segs[si].Len {
		si, so = si+1, 0
	}
	return c.n, pieces, si, so, pinned
}
