package wire

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

// sentinel reports whether err wraps one of the package's errors (or, for
// ReadFrame, an end of stream).
func sentinel(err error) bool {
	for _, s := range []error{ErrMalformed, ErrTooLarge, ErrBadMagic, ErrBadVersion, ErrUnknownType, ErrChecksum, io.EOF, io.ErrUnexpectedEOF} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// seedBodies are every sample and golden body, with its type.
func seedBodies() (ts []Type, bodies [][]byte) {
	for _, s := range samples() {
		ts = append(ts, s.m.Type())
		bodies = append(bodies, s.m.AppendBody(nil))
	}
	for _, tt := range []struct {
		t Type
		b []byte
	}{
		{TypeSubmit, append(submitHead(nil, nil), body(nil).u32(5000000)...)},
		{TypeAck, body(nil).u64(1).u32(1<<32 - 1).zeros(2)},
		{TypeUnregister, body(nil).u64(1).str("kv").u32(0)}, // WaitMs present but 0: refused
		{TypeChunk, fixed(1, 0, 1, 1, 1)},
		{99, nil},
	} {
		ts = append(ts, tt.t)
		bodies = append(bodies, tt.b)
	}
	return ts, bodies
}

func FuzzDecode(f *testing.F) {
	ts, bodies := seedBodies()
	for i := range ts {
		f.Add(uint8(ts[i]), bodies[i])
	}
	f.Fuzz(func(t *testing.T, typ uint8, b []byte) {
		m, err := Decode(Type(typ), b)
		if err != nil {
			if m != nil {
				t.Fatalf("got message %#v with error %v, want nil", m, err)
			}
			if !sentinel(err) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if m.Type() != Type(typ) {
			t.Fatalf("got type %s, want %s", m.Type(), Type(typ))
		}
		// The encoding is canonical: re-encoding gives the same bytes.
		re := m.AppendBody(nil)
		if !bytes.Equal(re, b) {
			t.Fatalf("re-encoded body differs:\n got %x\nwant %x", re, b)
		}
		m2, err := Decode(m.Type(), re)
		if err != nil {
			t.Fatalf("re-decode: got error %v, want nil", err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("re-decode: got %#v, want %#v", m2, m)
		}
	})
}

func FuzzParseHeader(f *testing.F) {
	for _, s := range samples() {
		f.Add(AppendFrame(nil, s.m, true, 0)[:HeaderSize])
	}
	f.Add(AppendHeader(nil, Header{Version: 1, Type: TypeChunk, Flags: FlagCRC, Length: MaxChunkBody, CRC: 1}))
	f.Add(AppendHeader(nil, Header{Version: 1, Type: TypeRegister, Flags: FlagFD, Length: 70}))
	f.Add([]byte("SG\x01\x0c\x00\x00\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00"))
	f.Add([]byte("SG"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b)
		if err != nil {
			if h != (Header{}) {
				t.Fatalf("got header %+v with error %v, want zero", h, err)
			}
			if !sentinel(err) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		re := AppendHeader(nil, h)
		if !bytes.Equal(re, b[:HeaderSize]) {
			t.Fatalf("re-encoded header differs:\n got %x\nwant %x", re, b[:HeaderSize])
		}
		h2, err := ParseHeader(re)
		if err != nil || h2 != h {
			t.Fatalf("re-parse: got %+v, %v; want %+v, nil", h2, err, h)
		}
	})
}

// FuzzChunk feeds a header length and the bytes after the header (fixed part,
// segments, possibly more) to DecodeChunkFixed and DecodeChunkSegs. A length
// of 0 stands for the length the fixed part implies, so that the fuzzer
// reaches the segments often.
func FuzzChunk(f *testing.F) {
	add := func(c *Chunk) {
		frame := AppendChunkHead(nil, c, nil, false, 0)
		h, _ := ParseHeader(frame)
		f.Add(h.Length, frame[HeaderSize:])
	}
	add(&Chunk{Transfer: 7, Index: 1, Count: 3, PayloadLen: 5, Segs: []ChunkSeg{{Region: 2, Len: 3, Offset: 0x10}, {Region: 0, Len: 2, Offset: 0x100}}})
	add(&Chunk{Transfer: 1, Count: 1, PayloadLen: 1 << 20, Segs: []ChunkSeg{{Len: 1 << 20}}})
	add(&Chunk{Transfer: 1, Count: 1, PayloadLen: 4, Segs: []ChunkSeg{{Len: 0}, {Len: 4}}})
	add(&Chunk{Transfer: 1, Index: 2, Count: 2, PayloadLen: 4, Segs: []ChunkSeg{{Len: 4}}})
	f.Add(uint32(24+16+5), fixed(1, 0, 1, MaxChunkSegs+1, 5))
	f.Add(uint32(0), append(fixed(1, 0, 1, 2, 5), append(seg(0, 2, 0), seg(1, 3, 1<<63)...)...))
	f.Fuzz(func(t *testing.T, length uint32, b []byte) {
		if length == 0 && len(b) >= ChunkFixedSize {
			length = uint32(ChunkFixedSize + uint64(le.Uint32(b[16:]))*ChunkSegSize + uint64(le.Uint32(b[20:])))
		}
		h := Header{Version: VersionMax, Type: TypeChunk, Length: length}
		var c Chunk
		nsegs, err := DecodeChunkFixed(h, b, &c)
		if err != nil {
			if nsegs != 0 || !reflect.DeepEqual(c, Chunk{}) {
				t.Fatalf("got %d, %+v with error %v, want zero", nsegs, c, err)
			}
			if !sentinel(err) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if nsegs < 1 || nsegs > MaxChunkSegs {
			t.Fatalf("nsegs %d out of range", nsegs)
		}
		if len(b) < ChunkFixedSize {
			t.Fatalf("accepted a %d-byte fixed part", len(b))
		}
		if err := DecodeChunkSegs(b[ChunkFixedSize:], nsegs, &c); err != nil {
			if len(c.Segs) != 0 {
				t.Fatalf("got %d segs with error %v, want 0", len(c.Segs), err)
			}
			if !sentinel(err) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		metaLen := ChunkFixedSize + nsegs*ChunkSegSize
		re := AppendChunkHead(nil, &c, nil, false, 0)
		if got := le.Uint32(re[8:]); got != length {
			t.Fatalf("re-encoded length: got %d, want %d", got, length)
		}
		if !bytes.Equal(re[HeaderSize:], b[:metaLen]) {
			t.Fatalf("re-encoded meta differs:\n got %x\nwant %x", re[HeaderSize:], b[:metaLen])
		}
		h2, err := ParseHeader(re)
		if err != nil {
			// Only the header's own limit can refuse a chunk whose meta was good.
			if length <= MaxChunkBody {
				t.Fatalf("re-parse header: %v", err)
			}
			return
		}
		var c2 Chunk
		n2, err := DecodeChunkFixed(h2, re[HeaderSize:], &c2)
		if err == nil {
			err = DecodeChunkSegs(re[HeaderSize+ChunkFixedSize:], n2, &c2)
		}
		if err != nil || !reflect.DeepEqual(c, c2) {
			t.Fatalf("re-decode: got %+v, %v; want %+v, nil", c2, err, c)
		}
	})
}

func FuzzReadFrame(f *testing.F) {
	var all []byte
	for i, s := range samples() {
		fr := AppendFrame(nil, s.m, i%2 == 1, 0)
		f.Add(fr)
		all = append(all, fr...)
	}
	f.Add(all)
	f.Add(append(AppendChunkHead(nil, &Chunk{Count: 1, PayloadLen: 1, Segs: []ChunkSeg{{Len: 1}}}, []byte("x"), true, 0), 'x'))
	f.Add(AppendHeader(nil, Header{Version: 1, Type: TypeQueryReply, Length: MaxControlBody}))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		var buf []byte
		for {
			h, m, b, err := ReadFrame(r, buf)
			buf = b
			if err != nil {
				if m != nil {
					t.Fatalf("got message %#v with error %v, want nil", m, err)
				}
				if !sentinel(err) {
					t.Fatalf("error %v wraps no sentinel", err)
				}
				if cap(buf) > 2*readGrowStep+len(data) {
					t.Fatalf("buffer of %d bytes for %d bytes of input", cap(buf), len(data))
				}
				return
			}
			re := AppendFrame(nil, m, h.Flags&FlagCRC != 0, h.Flags&(FlagFD|FlagInline))
			if !bytes.Equal(re, b) {
				t.Fatalf("re-encoded frame differs:\n got %x\nwant %x", re, b)
			}
			_, m2, _, err := ReadFrame(bytes.NewReader(re), nil)
			if err != nil || !reflect.DeepEqual(m, m2) {
				t.Fatalf("re-read: got %#v, %v; want %#v, nil", m2, err, m)
			}
		}
	})
}
