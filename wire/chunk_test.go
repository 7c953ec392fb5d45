package wire

import (
	"bytes"
	"errors"
	"hash/crc32"
	"math"
	"reflect"
	"strings"
	"testing"
)

// readChunk parses a whole chunk frame the way a data stream reader does.
func readChunk(frame []byte, c *Chunk) (payload []byte, err error) {
	h, err := ParseHeader(frame)
	if err != nil {
		return nil, err
	}
	b := frame[HeaderSize:]
	if len(b) != int(h.Length) {
		return nil, errors.New("test: frame length does not match header")
	}
	nsegs, err := DecodeChunkFixed(h, b, c)
	if err != nil {
		return nil, err
	}
	meta := b[:ChunkFixedSize+nsegs*ChunkSegSize]
	if err := DecodeChunkSegs(meta[ChunkFixedSize:], nsegs, c); err != nil {
		return nil, err
	}
	payload = b[len(meta):]
	if h.Flags&FlagCRC != 0 {
		if got := ChunkCRC(meta, payload); got != h.CRC {
			return nil, errorf(ErrChecksum, "chunk CRC %08x, header %08x", got, h.CRC)
		}
		if err := VerifyCRC(h, b); err != nil {
			return nil, err
		}
	}
	return payload, nil
}

func chunkFrame(c *Chunk, payload []byte, crc bool) []byte {
	return append(AppendChunkHead(nil, c, payload, crc, 0), payload...)
}

func TestChunkRoundTrip(t *testing.T) {
	payload := seq(300, 7)
	tests := []struct {
		name string
		c    Chunk
	}{
		{"one seg", Chunk{Transfer: 1, Index: 0, Count: 1, PayloadLen: 300, Segs: []ChunkSeg{{Region: 0, Len: 300, Offset: 0}}}},
		{"three segs", Chunk{Transfer: math.MaxUint64, Index: 9, Count: 10, PayloadLen: 300, Segs: []ChunkSeg{
			{Region: 4, Len: 100, Offset: 1 << 40}, {Region: 0, Len: 1, Offset: 0}, {Region: math.MaxUint32, Len: 199, Offset: math.MaxUint64 - 199}}}},
	}
	for _, tt := range tests {
		for _, crc := range []bool{false, true} {
			t.Run(tt.name+map[bool]string{false: "", true: "/crc"}[crc], func(t *testing.T) {
				frame := chunkFrame(&tt.c, payload, crc)
				if crc {
					want := crc32.Checksum(frame[HeaderSize:], crc32.MakeTable(crc32.Castagnoli))
					if got := le.Uint32(frame[12:]); got != want {
						t.Fatalf("header CRC: got %08x, want %08x", got, want)
					}
					if got := Flags(le.Uint16(frame[4:])); got != FlagCRC {
						t.Fatalf("flags: got %#x, want FlagCRC", got)
					}
				}
				var got Chunk
				p, err := readChunk(frame, &got)
				if err != nil {
					t.Fatalf("got error %v, want nil", err)
				}
				if !reflect.DeepEqual(got, tt.c) {
					t.Fatalf("got %+v, want %+v", got, tt.c)
				}
				if !bytes.Equal(p, payload) {
					t.Fatalf("payload: got %d bytes, want %d", len(p), len(payload))
				}
			})
		}
	}
}

func TestChunkSegsReuseCapacity(t *testing.T) {
	c := Chunk{Transfer: 1, Count: 1, PayloadLen: 3, Segs: []ChunkSeg{{Len: 1}, {Len: 1, Offset: 5}, {Region: 1, Len: 1}}}
	frame := chunkFrame(&c, []byte("abc"), false)
	got := Chunk{Segs: make([]ChunkSeg, 0, 8)}
	base := &got.Segs[:1][0]
	if _, err := readChunk(frame, &got); err != nil {
		t.Fatal(err)
	}
	if &got.Segs[0] != base {
		t.Fatalf("Segs reallocated, want its capacity reused")
	}
	if !reflect.DeepEqual(got.Segs, c.Segs) {
		t.Fatalf("got %+v, want %+v", got.Segs, c.Segs)
	}
}

// fixed encodes a chunk's fixed part as it goes on the wire.
func fixed(transfer uint64, index, count, nsegs, plen uint32) []byte {
	return body(nil).u64(transfer).u32(index).u32(count).u32(nsegs).u32(plen)
}

func seg(region, n uint32, off uint64) []byte { return body(nil).u32(region).u32(n).u64(off) }

func TestDecodeChunkFixedRejects(t *testing.T) {
	chunkHdr := func(length uint32) Header { return Header{Version: 1, Type: TypeChunk, Length: length} }
	tests := []struct {
		name string
		h    Header
		b    []byte
		err  error
		msg  string
	}{
		{"ok", chunkHdr(24 + 16 + 5), fixed(1, 0, 1, 1, 5), nil, ""},
		{"not a chunk header", Header{Version: 1, Type: TypeAck, Length: 45}, fixed(1, 0, 1, 1, 5), ErrMalformed, "header type is Ack"},
		{"short", chunkHdr(45), fixed(1, 0, 1, 1, 5)[:23], ErrMalformed, "fixed part of 23 bytes"},
		{"index = count", chunkHdr(45), fixed(1, 1, 1, 1, 5), ErrMalformed, "Chunk.Index: index 1 not below count 1"},
		{"count 0", chunkHdr(45), fixed(1, 0, 0, 1, 5), ErrMalformed, "Chunk.Index"},
		{"nsegs over limit", chunkHdr(45), fixed(1, 0, 1, MaxChunkSegs+1, 5), ErrTooLarge, "Chunk.Segs: count 65537 exceeds limit 65536"},
		{"nsegs 2^32-1", chunkHdr(45), fixed(1, 0, 1, math.MaxUint32, 5), ErrTooLarge, ""},
		{"no segments", chunkHdr(29), fixed(1, 0, 1, 0, 5), ErrMalformed, "no segments"},
		{"empty payload", chunkHdr(40), fixed(1, 0, 1, 1, 0), ErrMalformed, "empty payload"},
		{"length above", chunkHdr(46), fixed(1, 0, 1, 1, 5), ErrMalformed, "make a 45-byte body, header says 46"},
		{"length below", chunkHdr(44), fixed(1, 0, 1, 1, 5), ErrMalformed, "header says 44"},
		// 24 + 16 + 0xFFFFFFFF is 39 in 32-bit arithmetic.
		{"length wraps in 32 bits", chunkHdr(39), fixed(1, 0, 1, 1, math.MaxUint32), ErrMalformed, "make a 4294967335-byte body, header says 39"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Chunk{Transfer: 42, Segs: []ChunkSeg{{Len: 9}}}
			before := c
			n, err := DecodeChunkFixed(tt.h, tt.b, &c)
			if tt.err == nil {
				if err != nil || n != 1 {
					t.Fatalf("got %d, %v; want 1, nil", n, err)
				}
				if !reflect.DeepEqual(c.Segs, before.Segs) {
					t.Fatalf("Segs touched: got %+v, want %+v", c.Segs, before.Segs)
				}
				return
			}
			if !errors.Is(err, tt.err) {
				t.Fatalf("got error %v, want %v", err, tt.err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got error %q, want it to contain %q", err, tt.msg)
			}
			if n != 0 || !reflect.DeepEqual(c, before) {
				t.Fatalf("on error: got nsegs %d and %+v, want 0 and an untouched chunk", n, c)
			}
		})
	}
}

func TestDecodeChunkSegsRejects(t *testing.T) {
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	tests := []struct {
		name  string
		b     []byte
		nsegs int
		plen  uint32
		err   error
		msg   string
	}{
		{"ok", cat(seg(0, 2, 0), seg(1, 3, 8)), 2, 5, nil, ""},
		{"ok longer input", cat(seg(0, 5, 0), []byte("payload")), 1, 5, nil, ""},
		{"sum below payload", cat(seg(0, 2, 0), seg(1, 2, 8)), 2, 5, ErrMalformed, "lengths add up to 4, payload is 5"},
		{"sum above payload", cat(seg(0, 2, 0), seg(1, 4, 8)), 2, 5, ErrMalformed, "add up to 6"},
		{"sum would overflow u32", cat(seg(0, math.MaxUint32, 0), seg(1, 6, 0)), 2, 5, ErrMalformed, "add up to 4294967301"},
		{"zero length", cat(seg(0, 5, 0), seg(1, 0, 8)), 2, 5, ErrMalformed, "Chunk.Segs[1].Len: zero length"},
		{"offset overflow", seg(0, 5, math.MaxUint64-3), 1, 5, ErrMalformed, "Chunk.Segs[0].Offset"},
		{"short", seg(0, 5, 0)[:15], 1, 5, ErrMalformed, "1 segments need 16 bytes, have 15"},
		{"nsegs 0", nil, 0, 5, ErrMalformed, "count 0"},
		{"nsegs negative", nil, -1, 5, ErrMalformed, "count -1"},
		{"nsegs over limit", nil, MaxChunkSegs + 1, 5, ErrMalformed, "count 65537"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Chunk{PayloadLen: tt.plen, Segs: make([]ChunkSeg, 1, 4)}
			err := DecodeChunkSegs(tt.b, tt.nsegs, &c)
			if tt.err == nil {
				if err != nil || len(c.Segs) != tt.nsegs {
					t.Fatalf("got %d segs, %v; want %d, nil", len(c.Segs), err, tt.nsegs)
				}
				return
			}
			if !errors.Is(err, tt.err) {
				t.Fatalf("got error %v, want %v", err, tt.err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got error %q, want it to contain %q", err, tt.msg)
			}
			if len(c.Segs) != 0 {
				t.Fatalf("on error: got %d segs, want 0", len(c.Segs))
			}
		})
	}
}

func TestChunkCRCMismatch(t *testing.T) {
	c := Chunk{Transfer: 3, Count: 2, Index: 1, PayloadLen: 4, Segs: []ChunkSeg{{Region: 1, Len: 4, Offset: 64}}}
	for _, at := range []int{HeaderSize, HeaderSize + 20, HeaderSize + ChunkFixedSize + 2, HeaderSize + ChunkFixedSize + ChunkSegSize + 3} {
		frame := chunkFrame(&c, []byte("abcd"), true)
		frame[at] ^= 0x01
		var got Chunk
		_, err := readChunk(frame, &got)
		if at == HeaderSize+20 || at == HeaderSize+ChunkFixedSize+2 {
			// These bytes are checked before the CRC: payload length, segment length.
			if err == nil {
				t.Fatalf("flip at %d: got nil error, want one", at)
			}
			continue
		}
		if !errors.Is(err, ErrChecksum) {
			t.Fatalf("flip at %d: got %v, want ErrChecksum", at, err)
		}
	}
}

func TestChunkZeroAlloc(t *testing.T) {
	c := &Chunk{Transfer: 9, Index: 3, Count: 8, PayloadLen: 1 << 12, Segs: make([]ChunkSeg, 16)}
	for i := range c.Segs {
		c.Segs[i] = ChunkSeg{Region: uint32(i), Len: 256, Offset: uint64(i) << 20}
	}
	payload := make([]byte, c.PayloadLen)
	dst := make([]byte, 0, HeaderSize+ChunkFixedSize+16*ChunkSegSize)
	for _, crc := range []bool{false, true} {
		if n := testing.AllocsPerRun(100, func() { dst = AppendChunkHead(dst[:0], c, payload, crc, 0) }); n != 0 {
			t.Errorf("AppendChunkHead(crc=%v): got %v allocs, want 0", crc, n)
		}
	}
	h, _ := ParseHeader(dst)
	meta := dst[HeaderSize:]
	var got Chunk
	got.Segs = make([]ChunkSeg, 0, 16)
	if n := testing.AllocsPerRun(100, func() {
		nsegs, err := DecodeChunkFixed(h, meta, &got)
		if err != nil {
			t.Fatal(err)
		}
		if err := DecodeChunkSegs(meta[ChunkFixedSize:], nsegs, &got); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("DecodeChunkFixed+DecodeChunkSegs: got %v allocs, want 0", n)
	}
	if !reflect.DeepEqual(&got, c) {
		t.Fatalf("got %+v, want %+v", got, *c)
	}
}
