package wire

import (
	"fmt"
	"testing"
)

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

// scatteredSubmit is a push of n scattered 16 KiB blocks between two
// regions, as a paged KV cache sends it.
func scatteredSubmit(n int) *Submit {
	const block = 16 << 10
	m := &Submit{Req: 1, Route: "decode", Dir: Push, Tag: "req-1", LocalNames: []string{"kv-local"}, RemoteNames: []string{"kv-remote"}}
	m.Ops = make([]LocalOp, n)
	for i := range m.Ops {
		// A fixed odd stride scatters both sides without a random source.
		j := (i * 40503) % n
		m.Ops[i] = LocalOp{LocalOff: uint64(i) * block, RemoteOff: uint64(j) * block, Len: block}
	}
	return m
}

// BenchmarkAppendFrameSubmit65536 is what an engine pays to encode a push
// of 65,536 blocks into a fresh frame (as client.Client does).
func BenchmarkAppendFrameSubmit65536(b *testing.B) {
	m := scatteredSubmit(65536)
	b.ReportAllocs()
	for b.Loop() {
		_ = AppendFrame(nil, m, false, 0)
	}
}

// BenchmarkDecodeSubmit65536 is what the sidecar pays to decode it.
func BenchmarkDecodeSubmit65536(b *testing.B) {
	body := scatteredSubmit(65536).AppendBody(nil)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(TypeSubmit, body); err != nil {
			b.Fatal(err)
		}
	}
}

// kvSubmit is a SubmitKV of 32 layers and a table of blocks block ids on
// each side. A 1 GiB KV of 16 KiB blocks per layer and K/V (the 65,536
// ops of BenchmarkDecodeSubmit65536) is 1,024 blocks: the ops are the
// sidecar's to expand, chunk by chunk, not the frame's to carry.
func kvSubmit(blocks int) *SubmitKV {
	m := &SubmitKV{Req: 1, Route: "decode", Dir: Push, Tag: "req-1", Local: "prefill-tp0", Remote: "decode-tp0",
		LocalBlocks: make([]uint32, blocks), RemoteBlocks: make([]uint32, blocks), Tokens: uint32(blocks) * 16, HeadHi: 8,
		Key: make([]byte, 16)}
	for i := range 32 {
		m.Layers = append(m.Layers, uint32(i))
	}
	for i := range blocks {
		m.LocalBlocks[i] = uint32((i * 40503) % (2 * blocks))
		m.RemoteBlocks[i] = uint32((i * 7919) % (2 * blocks))
	}
	return m
}

// BenchmarkSubmitKV encodes (the engine) and decodes (the sidecar) SubmitKV
// frames of 1,024 blocks (1 GiB of 16 KiB blocks) and of 65,536: what a KV
// Submit sent in one piece costs against a byte Submit of as many bytes.
func BenchmarkSubmitKV(b *testing.B) {
	for _, blocks := range []int{1024, 65536} {
		m := kvSubmit(blocks)
		body := m.AppendBody(nil)
		b.Run(fmt.Sprintf("encode/%d", blocks), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = AppendFrame(nil, m, false, 0)
			}
		})
		b.Run(fmt.Sprintf("decode/%d", blocks), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Decode(TypeSubmitKV, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// chunk256 is a 4 MiB chunk of 256 scattered 16 KiB segments.
func chunk256() *Chunk {
	c := &Chunk{Transfer: 9, Index: 3, Count: 256, PayloadLen: 4 << 20, Segs: make([]ChunkSeg, 256)}
	for i := range c.Segs {
		c.Segs[i] = ChunkSeg{Len: 16 << 10, Offset: uint64((i*97)%256) << 14}
	}
	return c
}

func BenchmarkAppendChunkHead256(b *testing.B) {
	c := chunk256()
	dst := make([]byte, 0, HeaderSize+ChunkFixedSize+256*ChunkSegSize)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendChunkHead(dst[:0], c, nil, false, 0)
	}
}

func BenchmarkDecodeChunk256(b *testing.B) {
	c := chunk256()
	frame := AppendChunkHead(nil, c, nil, false, 0)
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
