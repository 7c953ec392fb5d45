package kvlayout

import "math"

// EmitFunc receives one segment of a side's memory: length bytes at
// tensorOff in region tensor (Regions[layer][t] of the SideSpec), which
// are bytes [wireOff, wireOff+length) of the canonical stream.
type EmitFunc func(layer, tensor int, tensorOff uint64, length uint32, wireOff uint64)

// Segments walks bytes [off, off+n) of the canonical stream (cut anywhere,
// even inside a row) and emits this side's memory segments for them in
// stream order. Consecutive pieces that are contiguous in this side's
// memory (same layer, same region, next address) are emitted as one
// segment, so a layout whose rows are token-major and heads-contiguous
// gives one segment per run of consecutive block ids. A range reaching
// past Len is cut at Len. It allocates nothing and does no per-row work
// where a token's heads, or a block's tokens, are contiguous.
func (s *Side) Segments(off, n uint64, emit EmitFunc) {
	c := coalescer{emit: emit}
	s.walk(off, n, &c, nil)
	c.flush()
}

// walk maps [off, off+n) column by column into c; a column whose heads lie
// apart in token-major order, or whose tokens do (a column that is part of
// a wider row: MLA's latent beside its rope), goes to strided as runs when
// it is not nil (Runs), piece by piece into c otherwise.
func (s *Side) walk(off, n uint64, c *coalescer, strided RunEmitFunc) {
	if off >= s.total {
		return
	}
	n = min(n, s.total-off)
	layer := off / s.layerBytes
	rem := off % s.layerBytes
	ci := 0
	for ci+1 < len(s.cols) && s.cols[ci+1].start <= rem {
		ci++
	}
	wire := off
	for n > 0 {
		m := &s.cols[ci]
		pos := rem - m.start
		take := min(m.bytes-pos, n)
		region := s.regions[layer][m.tensor]
		switch {
		case s.order == BlockMajor:
			s.walkBlocks(c, int(layer), region, m, pos, take, wire)
		case m.headsRun && !m.tokensRun && strided != nil:
			c.flush() // the runs must follow what the coalescer holds
			s.tokenRuns(strided, int(layer), region, m, pos, take, wire)
		case m.headsRun:
			s.walkRuns(c, int(layer), region, m, pos, take, wire)
		case strided != nil:
			c.flush() // the runs must follow what the coalescer holds
			s.stridedRuns(strided, int(layer), region, m, pos, take, wire)
		default:
			s.walkPieces(c, int(layer), region, m, pos, take, wire)
		}
		wire += take
		n -= take
		rem = m.start + m.bytes
		if ci++; ci == len(s.cols) {
			ci, rem = 0, 0
			layer++
		}
	}
}

// tokenAddr is the address of the transfer's first head of token t in
// column m.
func (s *Side) tokenAddr(m *colMap, t uint64) uint64 {
	gt := s.first + t
	b := uint64(s.table[gt/s.blockSize])
	return m.base + b*m.block + (gt%s.blockSize)*m.slot
}

// walkRuns handles a column whose token's heads are contiguous (one unit
// per token), and whose block's tokens may be contiguous as well: one
// segment per token, or per run of tokens inside a block.
func (s *Side) walkRuns(c *coalescer, layer, region int, m *colMap, pos, take, wire uint64) {
	t := pos / m.unit
	in := pos % m.unit
	for take > 0 {
		cnt := uint64(1)
		if m.tokensRun {
			cnt = min(s.blockSize-(s.first+t)%s.blockSize, s.tokens-t)
		}
		l := min(cnt*m.unit-in, take)
		c.add(layer, region, s.tokenAddr(m, t)+in, l, wire)
		wire += l
		take -= l
		t += cnt
		in = 0
	}
}

// walkPieces handles a column whose heads are apart in memory (HND, or a
// held slice wider than the transfer's heads): one piece per (token, head).
func (s *Side) walkPieces(c *coalescer, layer, region int, m *colMap, pos, take, wire uint64) {
	r := pos / m.piece
	in := pos % m.piece
	t, h := r/s.heads, r%s.heads
	for take > 0 {
		addr := s.tokenAddr(m, t) + h*m.head
		for ; h < s.heads && take > 0; h++ {
			l := min(m.piece-in, take)
			c.add(layer, region, addr+in, l, wire)
			wire += l
			take -= l
			addr += m.head
			in = 0
		}
		h = 0
		t++
	}
}

// walkBlocks handles a column in BlockMajor order: the transfer's tokens
// cut at this side's block boundaries into groups, and in each group, for
// each head, the group's tokens; one segment per (group, head) when a
// head's tokens lie together (HND), which the coalescer joins into one per
// block when the heads do too.
func (s *Side) walkBlocks(c *coalescer, layer, region int, m *colMap, pos, take, wire uint64) {
	bs := s.blockSize
	lead := min(bs-s.first%bs, s.tokens) // tokens of the first group
	for take > 0 {
		// The group holding byte pos: its first token and token count.
		var t0, n uint64
		if hp := s.heads * m.piece; pos < lead*hp {
			t0, n = 0, lead
		} else {
			g := (pos - lead*hp) / (bs * hp)
			t0 = lead + g*bs
			n = min(bs, s.tokens-t0)
		}
		in := pos - s.groupStart(t0, m)
		r := in / m.piece
		h, ti, sub := r/n, r%n, in%m.piece
		addr := s.tokenAddr(m, t0+ti) + h*m.head + sub
		var l uint64
		if m.slot == m.piece {
			l = min((n-ti)*m.piece-sub, take) // the rest of this head's tokens
		} else {
			l = min(m.piece-sub, take)
		}
		c.add(layer, region, addr, l, wire)
		pos += l
		wire += l
		take -= l
	}
}

// groupStart is the offset in column m's stream of the group whose first
// token is t0 (0, or a block boundary of this side).
func (s *Side) groupStart(t0 uint64, m *colMap) uint64 { return t0 * s.heads * m.piece }

// coalescer merges pieces that continue each other in memory into one
// segment and hands finished segments to emit, cut to fit a uint32 length.
type coalescer struct {
	emit          EmitFunc
	layer, region int
	addr, n, wire uint64
}

func (c *coalescer) add(layer, region int, addr, n, wire uint64) {
	if c.n > 0 && layer == c.layer && region == c.region && addr == c.addr+c.n {
		c.n += n
		return
	}
	c.flush()
	c.layer, c.region, c.addr, c.n, c.wire = layer, region, addr, n, wire
}

func (c *coalescer) flush() {
	for c.n > 0 {
		l := min(c.n, math.MaxUint32)
		c.emit(c.layer, c.region, c.addr, uint32(l), c.wire)
		c.addr += l
		c.wire += l
		c.n -= l
	}
}
