package wire

import "testing"

func benchChunk() (*Chunk, []byte) {
	c := &Chunk{Transfer: 9, Index: 3, Count: 8, PayloadLen: 1 << 20, Segs: make([]ChunkSeg, 8)}
	for i := range c.Segs {
		c.Segs[i] = ChunkSeg{Region: uint32(i), Len: 1 << 17, Offset: uint64(i) << 30}
	}
	return c, make([]byte, c.PayloadLen)
}

func BenchmarkAppendChunkHead(b *testing.B) {
	c, payload := benchChunk()
	dst := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendChunkHead(dst[:0], c, payload, false, 0)
	}
}

func BenchmarkAppendChunkHeadCRC(b *testing.B) {
	c, payload := benchChunk()
	dst := make([]byte, 0, 256)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendChunkHead(dst[:0], c, payload, true, 0)
	}
}

func BenchmarkDecodeChunk(b *testing.B) {
	c, payload := benchChunk()
	frame := AppendChunkHead(nil, c, payload, false, 0)
	h, err := ParseHeader(frame)
	if err != nil {
		b.Fatal(err)
	}
	meta := frame[HeaderSize:]
	var got Chunk
	b.ReportAllocs()
	for b.Loop() {
		nsegs, err := DecodeChunkFixed(h, meta, &got)
		if err != nil {
			b.Fatal(err)
		}
		if err := DecodeChunkSegs(meta[ChunkFixedSize:], nsegs, &got); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendFrameAck(b *testing.B) {
	var m Msg = &Ack{Transfer: 5, Chunks: []uint32{1, 2, 3, 4}}
	dst := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendFrame(dst[:0], m, false, 0)
	}
}

func BenchmarkDecodeAck(b *testing.B) {
	body := (&Ack{Transfer: 5, Chunks: []uint32{1, 2, 3, 4}}).AppendBody(nil)
	var a Ack
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeAck(body, &a); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeSubmit(b *testing.B) {
	m := &Submit{Req: 1, Route: "decode", Dir: Push, Tag: "t", LocalNames: []string{"a", "b"}, RemoteNames: []string{"c", "d"}}
	for i := 0; i < 64; i++ {
		m.Ops = append(m.Ops, LocalOp{Local: uint32(i % 2), Remote: uint32(i % 2), LocalOff: uint64(i) << 20, RemoteOff: uint64(i) << 20, Len: 1 << 20})
	}
	body := m.AppendBody(nil)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(TypeSubmit, body); err != nil {
			b.Fatal(err)
		}
	}
}
