package wire

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func hdr(mut func(b []byte)) []byte {
	b := AppendHeader(nil, Header{Version: VersionMax, Type: TypeAck, Length: 12})
	if mut != nil {
		mut(b)
	}
	return b
}

func TestParseHeader(t *testing.T) {
	tests := []struct {
		name string
		b    []byte
		want Header
		err  error
		msg  string
	}{
		{"ok", hdr(nil), Header{Version: 1, Type: TypeAck, Length: 12}, nil, ""},
		{"ok crc", AppendHeader(nil, Header{Version: 1, Type: TypeAck, Flags: FlagCRC, Length: 12, CRC: 0xabcdef01}),
			Header{Version: 1, Type: TypeAck, Flags: FlagCRC, Length: 12, CRC: 0xabcdef01}, nil, ""},
		{"ok fd on local", AppendHeader(nil, Header{Version: 1, Type: TypeRegister, Flags: FlagFD, Length: 50}),
			Header{Version: 1, Type: TypeRegister, Flags: FlagFD, Length: 50}, nil, ""},
		{"ok longer input", append(hdr(nil), 1, 2, 3), Header{Version: 1, Type: TypeAck, Length: 12}, nil, ""},
		{"ok control at limit", AppendHeader(nil, Header{Version: 1, Type: TypeQueryReply, Length: MaxControlBody}),
			Header{Version: 1, Type: TypeQueryReply, Length: MaxControlBody}, nil, ""},
		{"ok chunk at limit", AppendHeader(nil, Header{Version: 1, Type: TypeChunk, Length: MaxChunkBody}),
			Header{Version: 1, Type: TypeChunk, Length: MaxChunkBody}, nil, ""},
		{"empty", nil, Header{}, ErrMalformed, "0 bytes, need 16"},
		{"short", hdr(nil)[:15], Header{}, ErrMalformed, "15 bytes"},
		{"bad magic 0", hdr(func(b []byte) { b[0] = 's' }), Header{}, ErrBadMagic, "magic 0x73 0x47"},
		{"bad magic 1", hdr(func(b []byte) { b[1] = 0 }), Header{}, ErrBadMagic, ""},
		{"version 0", hdr(func(b []byte) { b[2] = 0 }), Header{}, ErrBadVersion, "version 0"},
		{"version above", hdr(func(b []byte) { b[2] = VersionMax + 1 }), Header{}, ErrBadVersion, ""},
		{"type 0", hdr(func(b []byte) { b[3] = 0 }), Header{}, ErrUnknownType, "type 0"},
		{"type 27", hdr(func(b []byte) { b[3] = 27 }), Header{}, ErrUnknownType, ""},
		{"type 65", hdr(func(b []byte) { b[3] = 65 }), Header{}, ErrUnknownType, ""},
		{"type 143", hdr(func(b []byte) { b[3] = 143 }), Header{}, ErrUnknownType, ""},
		{"type 255", hdr(func(b []byte) { b[3] = 255 }), Header{}, ErrUnknownType, ""},
		{"reserved lo", hdr(func(b []byte) { b[6] = 1 }), Header{}, ErrMalformed, "reserved field 0x0001"},
		{"reserved hi", hdr(func(b []byte) { b[7] = 0x80 }), Header{}, ErrMalformed, "reserved"},
		{"unknown flag", hdr(func(b []byte) { b[4] = 8 }), Header{}, ErrMalformed, "unknown flags 0x0008"},
		{"inline on ack", hdr(func(b []byte) { b[4] = byte(FlagInline) }), Header{}, ErrMalformed, "FlagInline is only for Announce and Chunk"},
		{"ok inline announce", AppendHeader(nil, Header{Version: 1, Type: TypeAnnounce, Flags: FlagInline, Length: 40}),
			Header{Version: 1, Type: TypeAnnounce, Flags: FlagInline, Length: 40}, nil, ""},
		{"ok inline chunk", AppendHeader(nil, Header{Version: 1, Type: TypeChunk, Flags: FlagInline | FlagCRC, Length: 100, CRC: 5}),
			Header{Version: 1, Type: TypeChunk, Flags: FlagInline | FlagCRC, Length: 100, CRC: 5}, nil, ""},
		{"unknown flag hi", hdr(func(b []byte) { b[5] = 0x80 }), Header{}, ErrMalformed, "unknown flags"},
		{"fd on peer frame", hdr(func(b []byte) { b[4] = byte(FlagFD) }), Header{}, ErrMalformed, "FlagFD on a peer frame"},
		{"fd on chunk", AppendHeader(nil, Header{Version: 1, Type: TypeChunk, Flags: FlagFD, Length: 100}), Header{}, ErrMalformed, "FlagFD"},
		{"crc without flag", hdr(func(b []byte) { b[12] = 1 }), Header{}, ErrMalformed, "without FlagCRC"},
		{"control too long", AppendHeader(nil, Header{Version: 1, Type: TypeQueryReply, Length: MaxControlBody + 1}), Header{}, ErrTooLarge, "QueryReply: length 16777217 exceeds limit 16777216"},
		{"control 2^32-1", AppendHeader(nil, Header{Version: 1, Type: TypeHello, Length: 1<<32 - 1}), Header{}, ErrTooLarge, ""},
		{"chunk too long", AppendHeader(nil, Header{Version: 1, Type: TypeChunk, Length: MaxChunkBody + 1}), Header{}, ErrTooLarge, "Chunk: length"},
		{"chunk too short", AppendHeader(nil, Header{Version: 1, Type: TypeChunk, Length: ChunkFixedSize - 1}), Header{}, ErrMalformed, "below the fixed part"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseHeader(tt.b)
			if tt.err == nil && err != nil {
				t.Fatalf("got error %v, want nil", err)
			}
			if tt.err != nil && !errors.Is(err, tt.err) {
				t.Fatalf("got error %v, want %v", err, tt.err)
			}
			if err != nil && !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got error %q, want it to contain %q", err, tt.msg)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestVerifyCRC(t *testing.T) {
	f := AppendFrame(nil, &Nack{Transfer: 1, Code: CodeBusy, Message: "later"}, true, 0)
	h, err := ParseHeader(f)
	if err != nil {
		t.Fatal(err)
	}
	body := f[HeaderSize:]
	if err := VerifyCRC(h, body); err != nil {
		t.Fatalf("good body: got %v, want nil", err)
	}
	bad := append([]byte(nil), body...)
	bad[len(bad)-1] ^= 1
	if err := VerifyCRC(h, bad); !errors.Is(err, ErrChecksum) {
		t.Fatalf("flipped bit: got %v, want ErrChecksum", err)
	}
	if err := VerifyCRC(h, body[:len(body)-1]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("short body: got %v, want ErrMalformed", err)
	}
	h.Flags = 0
	if err := VerifyCRC(h, bad); err != nil {
		t.Fatalf("no FlagCRC: got %v, want nil", err)
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestReadFrameStream(t *testing.T) {
	var stream []byte
	var want []Msg
	for i, s := range samples() {
		stream = AppendFrame(stream, s.m, i%2 == 0, 0)
		want = append(want, s.m)
	}
	r := &countingReader{r: bytes.NewReader(stream)}
	buf := make([]byte, 0, 32) // small: ReadFrame grows it
	for i, w := range want {
		h, m, b, err := ReadFrame(r, buf)
		if err != nil {
			t.Fatalf("frame %d: got error %v, want nil", i, err)
		}
		if h.Type != w.Type() {
			t.Fatalf("frame %d: got type %s, want %s", i, h.Type, w.Type())
		}
		if !bytes.Equal(b, AppendFrame(nil, w, i%2 == 0, 0)) {
			t.Fatalf("frame %d: returned buffer is not the raw frame", i)
		}
		buf = b
		if got := m; !equalMsg(got, w) {
			t.Fatalf("frame %d: got %#v, want %#v", i, got, w)
		}
	}
	if _, m, _, err := ReadFrame(r, buf); err != io.EOF || m != nil {
		t.Fatalf("at end: got %v, %v; want nil, io.EOF", m, err)
	}
	if r.n != len(stream) {
		t.Fatalf("read %d bytes, want %d", r.n, len(stream))
	}
}

func TestReadFrameErrors(t *testing.T) {
	good := AppendFrame(nil, &Fail{Req: 1, Code: CodeBusy, Message: "busy"}, true, 0)
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)-1] ^= 0x20
	chunk := AppendChunkHead(nil, &Chunk{Transfer: 1, Count: 1, PayloadLen: 4, Segs: []ChunkSeg{{Len: 4}}}, []byte("data"), false, 0)
	chunk = append(chunk, "data"...)
	bigClaim := AppendHeader(nil, Header{Version: 1, Type: TypeQueryReply, Length: MaxControlBody})
	bigClaim = append(bigClaim, make([]byte, 100)...)
	badBody := AppendHeader(nil, Header{Version: 1, Type: TypeOK, Length: 3})
	badBody = append(badBody, 1, 2, 3)
	tests := []struct {
		name    string
		in      []byte
		err     error
		msg     string
		maxRead int // bytes ReadFrame may consume; 0: any
	}{
		{"empty stream", nil, io.EOF, "", 0},
		{"partial header", good[:5], io.ErrUnexpectedEOF, "read header", 0},
		{"partial body", good[:len(good)-2], io.ErrUnexpectedEOF, "read Fail body", 0},
		{"bad magic", append([]byte("XX"), good[2:]...), ErrBadMagic, "", HeaderSize},
		{"crc mismatch", flipped, ErrChecksum, "Fail: body CRC32C", 0},
		{"chunk", chunk, ErrUnknownType, "Chunk frame", HeaderSize},
		{"body malformed", badBody, ErrMalformed, "OK.Req", 0},
		{"huge claim, short stream", bigClaim, io.ErrUnexpectedEOF, "100 of 16777216", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &countingReader{r: bytes.NewReader(tt.in)}
			_, m, buf, err := ReadFrame(r, nil)
			if m != nil {
				t.Fatalf("got message %#v, want nil", m)
			}
			if !errors.Is(err, tt.err) {
				t.Fatalf("got error %v, want %v", err, tt.err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got error %q, want it to contain %q", err, tt.msg)
			}
			if tt.maxRead > 0 && r.n > tt.maxRead {
				t.Fatalf("read %d bytes, want at most %d", r.n, tt.maxRead)
			}
			// The buffer grows with the bytes that arrived, not with the claim.
			if cap(buf) > 2*readGrowStep+len(tt.in) {
				t.Fatalf("buffer capacity %d for a %d-byte stream", cap(buf), len(tt.in))
			}
		})
	}
}

func TestReadFrameReusesBuffer(t *testing.T) {
	f := AppendFrame(nil, &OK{Req: 3}, false, 0)
	buf := make([]byte, 0, 1024)
	_, _, got, err := ReadFrame(bytes.NewReader(f), buf)
	if err != nil {
		t.Fatal(err)
	}
	if &got[:1][0] != &buf[:1][0] {
		t.Fatalf("got a new buffer, want the one passed in reused")
	}
	n := testing.AllocsPerRun(100, func() {
		_, _, got, _ = ReadFrame(bytes.NewReader(f), got)
	})
	// bytes.NewReader and the decoded *OK.
	if n > 2 {
		t.Fatalf("allocs per ReadFrame with a big enough buffer: got %v, want <= 2", n)
	}
}

func equalMsg(a, b Msg) bool {
	return bytes.Equal(AppendFrame(nil, a, false, 0), AppendFrame(nil, b, false, 0))
}
