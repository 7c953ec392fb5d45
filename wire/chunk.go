package wire

import (
	"hash/crc32"
	"math"
)

// AppendChunkHead appends a chunk frame's header and meta (fixed part and
// segments) for a payload that the caller writes right after it. With crc,
// the CRC32C covers meta and payload. Segment lengths must add up to
// len(payload) == c.PayloadLen.
//
// The header's Length is ChunkFixedSize + len(c.Segs)*ChunkSegSize +
// c.PayloadLen. Nothing is checked here (the receiver checks everything);
// payload is only read for the CRC. It allocates nothing when dst has room
// for HeaderSize + ChunkFixedSize + len(c.Segs)*ChunkSegSize more bytes.
// extra flags (FlagInline) are ORed into the header.
func AppendChunkHead(dst []byte, c *Chunk, payload []byte, crc bool, extra Flags) []byte {
	n := len(c.Segs)
	flags := extra &^ FlagCRC
	if crc {
		flags |= FlagCRC
	}
	start := len(dst)
	dst = AppendHeader(dst, Header{
		Version: VersionMax,
		Type:    TypeChunk,
		Flags:   flags,
		Length:  uint32(ChunkFixedSize + n*ChunkSegSize + int(c.PayloadLen)),
	})
	meta := len(dst)
	dst = appendU64(dst, c.Transfer)
	dst = appendU32(dst, c.Index)
	dst = appendU32(dst, c.Count)
	dst = appendU32(dst, uint32(n))
	dst = appendU32(dst, c.PayloadLen)
	for i := range c.Segs {
		s := &c.Segs[i]
		dst = appendU32(dst, s.Region)
		dst = appendU32(dst, s.Len)
		dst = appendU64(dst, s.Offset)
	}
	if crc {
		le.PutUint32(dst[start+12:], ChunkCRC(dst[meta:], payload))
	}
	return dst
}

// DecodeChunkFixed decodes the fixed 24 bytes of a chunk body into c (Segs
// untouched) and checks them against the header: nsegs <= MaxChunkSegs,
// ChunkFixedSize + nsegs*ChunkSegSize + PayloadLen == h.Length, Index < Count.
// It returns the number of segments to read next.
//
// It also requires h.Type == TypeChunk, at least one segment and a non-empty
// payload. b may be longer than ChunkFixedSize; only its first
// ChunkFixedSize bytes are read. On error c is unchanged and nsegs is 0.
func DecodeChunkFixed(h Header, b []byte, c *Chunk) (nsegs int, err error) {
	if h.Type != TypeChunk {
		return 0, errorf(ErrMalformed, "Chunk: header type is %s", h.Type)
	}
	if len(b) < ChunkFixedSize {
		return 0, errorf(ErrMalformed, "Chunk: fixed part of %d bytes, need %d", len(b), ChunkFixedSize)
	}
	transfer := le.Uint64(b[0:])
	index := le.Uint32(b[8:])
	count := le.Uint32(b[12:])
	ns := le.Uint32(b[16:])
	plen := le.Uint32(b[20:])
	switch {
	case ns > MaxChunkSegs:
		return 0, errorf(ErrTooLarge, "Chunk.Segs: count %d exceeds limit %d", ns, MaxChunkSegs)
	case ns == 0:
		return 0, errorf(ErrMalformed, "Chunk.Segs: no segments")
	case plen == 0:
		return 0, errorf(ErrMalformed, "Chunk.PayloadLen: empty payload")
	case index >= count:
		return 0, errorf(ErrMalformed, "Chunk.Index: index %d not below count %d", index, count)
	}
	if want := uint64(ChunkFixedSize) + uint64(ns)*ChunkSegSize + uint64(plen); want != uint64(h.Length) {
		return 0, errorf(ErrMalformed, "Chunk: %d segments and %d payload bytes make a %d-byte body, header says %d", ns, plen, want, h.Length)
	}
	c.Transfer, c.Index, c.Count, c.PayloadLen = transfer, index, count, plen
	return int(ns), nil
}

// DecodeChunkSegs decodes nsegs segments from b into c.Segs (reusing its
// capacity) and checks that their lengths add up to c.PayloadLen without
// overflow and that none is empty.
//
// It also rejects a segment whose Offset+Len overflows. b may be longer than
// nsegs*ChunkSegSize. On error c.Segs is empty (its capacity kept).
func DecodeChunkSegs(b []byte, nsegs int, c *Chunk) error {
	if nsegs <= 0 || nsegs > MaxChunkSegs {
		c.Segs = c.Segs[:0]
		return errorf(ErrMalformed, "Chunk.Segs: count %d outside 1 to %d", nsegs, MaxChunkSegs)
	}
	if need := nsegs * ChunkSegSize; len(b) < need {
		c.Segs = c.Segs[:0]
		return errorf(ErrMalformed, "Chunk.Segs: %d segments need %d bytes, have %d", nsegs, need, len(b))
	}
	segs := c.Segs[:0]
	if cap(segs) < nsegs {
		segs = make([]ChunkSeg, nsegs)
	} else {
		segs = segs[:nsegs]
	}
	var sum uint64
	for i := range segs {
		p := b[i*ChunkSegSize : (i+1)*ChunkSegSize]
		s := ChunkSeg{Region: le.Uint32(p[0:]), Len: le.Uint32(p[4:]), Offset: le.Uint64(p[8:])}
		if s.Len == 0 {
			c.Segs = segs[:0]
			return errorf(ErrMalformed, "Chunk.Segs[%d].Len: zero length", i)
		}
		if s.Offset > math.MaxUint64-uint64(s.Len) {
			c.Segs = segs[:0]
			return errorf(ErrOverflow, "Chunk.Segs[%d].Offset: offset %d + length %d overflows", i, s.Offset, s.Len)
		}
		sum += uint64(s.Len)
		segs[i] = s
	}
	if sum != uint64(c.PayloadLen) {
		c.Segs = segs[:0]
		return errorf(ErrMalformed, "Chunk.Segs: lengths add up to %d, payload is %d", sum, c.PayloadLen)
	}
	c.Segs = segs
	return nil
}

// ChunkCRC returns the CRC32C of a chunk's meta followed by its payload, as
// the header carries it.
func ChunkCRC(meta, payload []byte) uint32 {
	return crc32.Update(crc32.Update(0, castagnoli, meta), castagnoli, payload)
}
