package kvlayout

// RunEmitFunc receives one strided run of a side's memory: n2 rows of n1
// pieces of piece bytes in region Regions[layer][region], piece (i2, i1)
// at tensorOff + i2*s2 + i1*s1; the pieces, in row-major order, are bytes
// [wireOff, wireOff + piece*n1*n2) of the canonical stream. A dimension of
// one piece or one row has stride 0.
type RunEmitFunc func(layer, region int, tensorOff uint64, piece uint32, n1 uint32, s1 uint64, n2 uint32, s2 uint64, wireOff uint64)

// Runs walks bytes [off, off+n) of the canonical stream like Segments, and
// emits the same bytes in the same order as strided runs: a column whose
// heads lie apart in token-major order (vLLM's HND) gives one run per run
// of tokens inside a block (n1 heads head-stride apart, n2 tokens
// slot-stride apart) instead of a segment per (token, head); pieces cut
// at the range's ends are runs of one piece. A column whose token's heads
// are contiguous but whose tokens are not (part of a wider row) gives one
// run per run of tokens inside a block. Every other column is contiguous
// per block run and gives Segments' coalesced segments as runs of one
// piece. It allocates nothing.
func (s *Side) Runs(off, n uint64, emit RunEmitFunc) {
	c := coalescer{emit: func(layer, region int, toff uint64, length uint32, wire uint64) {
		emit(layer, region, toff, length, 1, 0, 1, 0, wire)
	}}
	s.walk(off, n, &c, emit)
	c.flush()
}

// stridedRuns is walkPieces as runs: the partial piece and partial token
// at the start, then one run per run of whole tokens inside a block, then
// the whole pieces and the partial piece at the end. m.piece fits a
// uint32 (a row is at most 65535 elements of 4 bytes) and the heads of a
// transfer and the tokens of a block count in uint32.
func (s *Side) stridedRuns(emit RunEmitFunc, layer, region int, m *colMap, pos, take, wire uint64) {
	p := uint32(m.piece)
	r := pos / m.piece
	in := pos % m.piece
	t, h := r/s.heads, r%s.heads
	if in > 0 { // the rest of a piece cut before
		l := min(m.piece-in, take)
		emit(layer, region, s.tokenAddr(m, t)+h*m.head+in, uint32(l), 1, 0, 1, 0, wire)
		wire += l
		take -= l
		if h++; h == s.heads {
			h, t = 0, t+1
		}
	}
	if h > 0 && take >= m.piece { // the rest of a token cut before
		k := min(s.heads-h, take/m.piece)
		emit(layer, region, s.tokenAddr(m, t)+h*m.head, p, uint32(k), headStride(k, m), 1, 0, wire)
		wire += k * m.piece
		take -= k * m.piece
		if h += k; h == s.heads {
			h, t = 0, t+1
		}
	}
	unit := s.heads * m.piece
	for h == 0 && take >= unit { // whole tokens: one run per block's run
		cnt := min(s.blockSize-(s.first+t)%s.blockSize, take/unit)
		s2 := m.slot
		if cnt == 1 {
			s2 = 0
		}
		emit(layer, region, s.tokenAddr(m, t), p, uint32(s.heads), headStride(s.heads, m), uint32(cnt), s2, wire)
		wire += cnt * unit
		take -= cnt * unit
		t += cnt
	}
	if k := take / m.piece; k > 0 { // whole pieces of a token cut after
		emit(layer, region, s.tokenAddr(m, t)+h*m.head, p, uint32(k), headStride(k, m), 1, 0, wire)
		wire += k * m.piece
		take -= k * m.piece
		h += k
	}
	if take > 0 { // a piece cut after
		emit(layer, region, s.tokenAddr(m, t)+h*m.head, uint32(take), 1, 0, 1, 0, wire)
	}
}

// tokenRuns is walkRuns as runs, for a column whose token's heads are
// contiguous but whose tokens are not (the column is part of a wider row,
// as MLA's 512-wide latent in a 576-wide row is when the peer keeps latent
// and rope apart): one run per run of whole tokens inside a block (n2
// tokens slot-stride apart) instead of a segment per token, which took a 4
// MiB chunk from 7,250 segments to 2 runs per block. m.unit fits a uint32
// (a token's heads of one column are one row of the engine's tensor, at
// most 65535 elements of 4 bytes, times the heads the transfer moves).
func (s *Side) tokenRuns(emit RunEmitFunc, layer, region int, m *colMap, pos, take, wire uint64) {
	t := pos / m.unit
	if in := pos % m.unit; in > 0 { // the rest of a token cut before
		l := min(m.unit-in, take)
		emit(layer, region, s.tokenAddr(m, t)+in, uint32(l), 1, 0, 1, 0, wire)
		wire += l
		take -= l
		t++
	}
	for take >= m.unit { // whole tokens: one run per block's run
		cnt := min(s.blockSize-(s.first+t)%s.blockSize, take/m.unit)
		s2 := m.slot
		if cnt == 1 {
			s2 = 0
		}
		emit(layer, region, s.tokenAddr(m, t), uint32(m.unit), 1, 0, uint32(cnt), s2, wire)
		wire += cnt * m.unit
		take -= cnt * m.unit
		t += cnt
	}
	if take > 0 { // a token cut after
		emit(layer, region, s.tokenAddr(m, t), uint32(take), 1, 0, 1, 0, wire)
	}
}

func headStride(k uint64, m *colMap) uint64 {
	if k == 1 {
		return 0
	}
	return m.head
}
