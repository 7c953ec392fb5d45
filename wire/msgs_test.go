package wire

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

func seq(n int, from byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = from + byte(i)
	}
	return b
}

func nonce(from byte) (a [NonceSize]byte) { copy(a[:], seq(NonceSize, from)); return }
func sid(from byte) (a [SessionIDSize]byte) {
	copy(a[:], seq(SessionIDSize, from))
	return
}

// sample is one message value for the table-driven tests. Empty lists and
// byte slices are nil, as Decode returns them.
type sample struct {
	name string
	m    Msg
}

func samples() []sample {
	return append([]sample{
		{"Hello", &Hello{VersionMin: 1, VersionMax: 3, NodeName: "prefill-0", HostID: "host-7f3a", Nonce: nonce(1), SlotSize: 4 << 20, Window: 64}},
		{"Challenge", &Challenge{Version: 1, NodeName: "decode-1", HostID: "host-9", Nonce: nonce(40), Proof: nonce(90)}},
		{"Auth", &Auth{Proof: nonce(200)}},
		{"Welcome", &Welcome{SessionID: sid(3), SlotSize: 1 << 26, Window: 128, MaxStreams: 8}},
		{"DataHello", &DataHello{SessionID: sid(9), Stream: 3, Proof: nonce(77)}},
		{"DataAccept", &DataAccept{Stream: 65535}},
		{"CatalogRequest", &CatalogRequest{Seq: 1 << 40}},
		{"Catalog", &Catalog{Seq: 9, Regions: []RegionInfo{
			{Name: "kv.layer0", Size: 1 << 30, Access: AccessRemoteRead | AccessRemoteWrite, Device: "cuda:1"},
			{Name: "", Size: 0, Access: 0, Device: ""},
			{Name: "kv.layer1", Size: math.MaxUint64, Access: AccessAll, Device: "hostmem:0"},
		}}},
		{"CatalogEmpty", &Catalog{Seq: 10}},
		{"Announce", &Announce{Transfer: 0xdeadbeef01, Tag: "req-42/layer-3", Total: 3 << 20, Regions: []string{"k", "v"}, Ends: []uint64{1 << 20, 2 << 20}}},
		{"AnnounceEmpty", &Announce{Transfer: 2}},
		{"PullRequest", &PullRequest{Transfer: 7, Tag: "pull", SrcRegions: []string{"a", "bb"}, Ops: []Op{
			{Src: 0, Dst: 5, SrcOff: 0, DstOff: 4096, Len: 4096},
			{Src: 1, Dst: 0, SrcOff: 1 << 33, DstOff: 0, Len: 1},
		}}},
		{"PullRequestNoOps", &PullRequest{Transfer: 8, SrcRegions: []string{"x"}}},
		{"Accept", &Accept{Transfer: math.MaxUint64}},
		{"Ack", &Ack{Transfer: 11, Chunks: []uint32{0, 1, 2, 99, math.MaxUint32}}},
		{"AckEmpty", &Ack{Transfer: 12}},
		{"Nack", &Nack{Transfer: 13, Code: CodeOutOfRange, Message: "region kv.layer0: end 5000 beyond size 4096"}},
		{"Credit", &Credit{Grant: 17}},
		{"Resend", &Resend{Transfer: 1<<40 | 3, Chunk: math.MaxUint32}},
		{"Heartbeat", &Heartbeat{Seq: 5, UnixNanos: -1234567890123}},
		{"Goodbye", &Goodbye{Reason: "shutting down"}},
		{"Error", &Error{Code: CodeAuthFailed, Message: "bad proof ✗"}},
		{"Register", &Register{Req: 1, Name: "kv.layer0", Handle: 2, Access: AccessLocalRead | AccessRemoteWrite, Ordinal: 1,
			AllocSize: 1 << 32, Offset: 4096, Length: 1 << 20, Addr: 0x7f0000000000, HandleRaw: seq(64, 10)}},
		{"RegisterNoHandle", &Register{Req: 2, Name: "h", Handle: 0, Access: AccessAll, Length: 10}},
		{"Unregister", &Unregister{Req: 3, Name: "kv.layer0"}},
		{"UnregisterWait", &Unregister{Req: 3, Name: "kv.layer0", WaitMs: 10000}},
		{"UnregisterWaitMax", &Unregister{Req: 4, Name: "", WaitMs: math.MaxUint32}},
		{"Submit", &Submit{Req: 4, Route: "decode", Dir: Pull, Checksum: ChecksumOff, Tag: "t1",
			LocalNames: []string{"l0", "l1", "l2"}, RemoteNames: []string{"r0"},
			Ops: []LocalOp{{Local: 2, Remote: 0, LocalOff: 1, RemoteOff: 2, Len: 3}, {Local: 0, Remote: 0, LocalOff: 1 << 40, RemoteOff: 0, Len: 1 << 20}}}},
		{"SubmitEmpty", &Submit{Req: 5, Route: "r", Dir: Push}},
		{"SubmitPeer", &Submit{Req: 5, Route: "r", Dir: Push, LocalNames: []string{"a"}, RemoteNames: []string{"b"},
			Ops: []LocalOp{{Len: 1}}, Peer: "decode-1"}},
		{"SubmitPeerNoOps", &Submit{Req: 5, Route: "r", Dir: Pull, Peer: "10.0.0.5:7100"}},
		{"SubmitWaitPeer", &SubmitWait{Submit{Req: 5, Route: "r", Dir: Push, Peer: "decode-0"}}},
		{"SubmitWait", &SubmitWait{Submit{Req: 5, Route: "r", Dir: Push, Tag: "w", LocalNames: []string{"a"}, RemoteNames: []string{"b"},
			Ops: []LocalOp{{Local: 0, Remote: 0, LocalOff: 4096, RemoteOff: 8192, Len: 4096}}}}},
		{"Submitted", &Submitted{Req: 6, Transfer: 77}},
		{"Wait", &Wait{Req: 7, Transfer: 77, TimeoutMs: 30000}},
		{"Status", &Status{Req: 8, Transfer: 77}},
		{"XferStatus", &XferStatus{Req: 9, Transfer: 77, State: StateFailed, Done: 100, Total: 200, Code: CodeTimeout, Message: "deadline"}},
		{"Cancel", &Cancel{Req: 10, Transfer: 77}},
		{"Subscribe", &Subscribe{Req: 11}},
		{"Notify", &Notify{Transfer: 78, Peer: "prefill-0", Route: "", Tag: "layer-9", Dir: Push, Bytes: 1 << 30, Code: CodeOK}},
		{"NotifyKV", &Notify{Transfer: 79, Peer: "prefill-1", Tag: "req-3", Dir: Push, Bytes: 1 << 20, KV: "kv", Layers: []uint32{0, 1, 2}, First: 16, Tokens: 4000}},
		{"Query", &Query{Req: 12, What: QueryCatalog, Arg: "decode"}},
		{"QueryReply", &QueryReply{Req: 13, JSON: []byte(`{"node":"a","regions":3}`)}},
		{"QueryReplyEmpty", &QueryReply{Req: 14}},
		{"OK", &OK{Req: 15}},
		{"Fail", &Fail{Req: 16, Code: CodeUnknownRoute, Message: "no route \"x\""}},
	}, append(append(append(append(append(nodeSamples(), kvSamples()...), joinSamples()...), ticketSamples()...), grantSamples()...), piecesSamples()...)...)
}

func TestSamplesCoverEveryType(t *testing.T) {
	seen := map[Type]bool{}
	for _, s := range samples() {
		seen[s.m.Type()] = true
	}
	for typ := range typeNames {
		if typ == TypeChunk {
			continue
		}
		if !seen[typ] {
			t.Errorf("no sample of %s", typ)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	for _, s := range samples() {
		t.Run(s.name, func(t *testing.T) {
			body := s.m.AppendBody(nil)
			got, err := Decode(s.m.Type(), body)
			if err != nil {
				t.Fatalf("Decode: got error %v, want nil", err)
			}
			if !reflect.DeepEqual(got, s.m) {
				t.Fatalf("Decode: got %#v, want %#v", got, s.m)
			}
			// The body does not alias the input: scribbling on it changes nothing.
			for i := range body {
				body[i] ^= 0xff
			}
			if !reflect.DeepEqual(got, s.m) {
				t.Fatalf("decoded message changed with its input buffer: got %#v", got)
			}
			// Appending to a non-empty dst leaves the prefix alone.
			pre := []byte("prefix")
			b2 := s.m.AppendBody(append([]byte(nil), pre...))
			if !bytes.HasPrefix(b2, pre) {
				t.Fatalf("AppendBody clobbered dst prefix: got %q", b2[:len(pre)])
			}
		})
	}
}

func TestFrameRoundTrip(t *testing.T) {
	for _, s := range samples() {
		for _, crc := range []bool{false, true} {
			name := s.name
			if crc {
				name += "/crc"
			}
			t.Run(name, func(t *testing.T) {
				var extra Flags
				if isLocal(s.m.Type()) {
					extra = FlagFD
				}
				frame := AppendFrame([]byte("xx"), s.m, crc, extra)[2:]
				h, m, buf, err := ReadFrame(bytes.NewReader(frame), nil)
				if err != nil {
					t.Fatalf("ReadFrame: got error %v, want nil", err)
				}
				wantFlags := extra
				if crc {
					wantFlags |= FlagCRC
				}
				if h.Type != s.m.Type() || h.Flags != wantFlags || h.Version != VersionMax || int(h.Length) != len(frame)-HeaderSize {
					t.Fatalf("header: got %+v, want type %s flags %#x length %d", h, s.m.Type(), wantFlags, len(frame)-HeaderSize)
				}
				if !crc && h.CRC != 0 {
					t.Fatalf("CRC without FlagCRC: got %#x, want 0", h.CRC)
				}
				if !bytes.Equal(buf, frame) {
					t.Fatalf("returned buffer: got %x, want the raw frame %x", buf, frame)
				}
				if !reflect.DeepEqual(m, s.m) {
					t.Fatalf("ReadFrame: got %#v, want %#v", m, s.m)
				}
			})
		}
	}
}

func hexBytes(parts ...any) []byte {
	var b []byte
	for _, p := range parts {
		switch v := p.(type) {
		case int:
			b = append(b, byte(v))
		case string:
			b = append(b, v...)
		case []byte:
			b = append(b, v...)
		default:
			panic("hexBytes: bad part")
		}
	}
	return b
}

// Golden frames, computed by hand from the layout in docs/PROTOCOL.md.
func TestGolden(t *testing.T) {
	tests := []struct {
		name string
		got  []byte
		want []byte
	}{
		{
			name: "Header",
			got:  AppendHeader(nil, Header{Version: 1, Type: TypeNack, Flags: FlagCRC, Length: 0x01020304, CRC: 0xA1B2C3D4}),
			want: hexBytes("SG", 1, 13, 0x01, 0x00, 0x00, 0x00, 0x04, 0x03, 0x02, 0x01, 0xD4, 0xC3, 0xB2, 0xA1),
		},
		{
			name: "Hello",
			got: AppendFrame(nil, &Hello{VersionMin: 1, VersionMax: 2, NodeName: "a", HostID: "hb", Nonce: nonce(0),
				SlotSize: 0x01020304, Window: 16}, false, 0),
			want: hexBytes(
				"SG", 1, 1, 0, 0, 0, 0, 49, 0, 0, 0, 0, 0, 0, 0, // header: length 49
				1, 2, // versions
				1, 0, "a", // node name
				2, 0, "hb", // host id
				seq(32, 0),             // nonce
				0x04, 0x03, 0x02, 0x01, // slot size
				16, 0, 0, 0, // window
			),
		},
		{
			name: "Ack",
			got:  AppendFrame(nil, &Ack{Transfer: 0x0102030405060708, Chunks: []uint32{1, 0x0A0B0C0D}}, false, 0),
			want: hexBytes(
				"SG", 1, 12, 0, 0, 0, 0, 20, 0, 0, 0, 0, 0, 0, 0,
				8, 7, 6, 5, 4, 3, 2, 1, // transfer
				2, 0, 0, 0, // count
				1, 0, 0, 0,
				0x0D, 0x0C, 0x0B, 0x0A,
			),
		},
		{
			name: "Resend",
			got:  AppendFrame(nil, &Resend{Transfer: 0x0102030405060708, Chunk: 0x0A0B0C0D}, false, 0),
			want: hexBytes(
				"SG", 1, 20, 0, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0,
				8, 7, 6, 5, 4, 3, 2, 1, // transfer
				0x0D, 0x0C, 0x0B, 0x0A, // chunk index
			),
		},
		{
			name: "ChunkHead",
			got: AppendChunkHead(nil, &Chunk{Transfer: 7, Index: 1, Count: 3, PayloadLen: 5,
				Segs: []ChunkSeg{{Region: 2, Len: 3, Offset: 0x10}, {Region: 0, Len: 2, Offset: 0x100}}}, []byte("hello"), false, 0),
			want: hexBytes(
				"SG", 1, 64, 0, 0, 0, 0, 61, 0, 0, 0, 0, 0, 0, 0, // 24 + 2*16 + 5
				7, 0, 0, 0, 0, 0, 0, 0, // transfer
				1, 0, 0, 0, // index
				3, 0, 0, 0, // count
				2, 0, 0, 0, // segments
				5, 0, 0, 0, // payload length
				2, 0, 0, 0, 3, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0,
				0, 0, 0, 0, 2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
			),
		},
		{
			name: "Submit",
			got: AppendFrame(nil, &Submit{Req: 5, Route: "r", Dir: Push, Checksum: ChecksumOn, Tag: "t",
				LocalNames: []string{"a"}, RemoteNames: []string{"b", "c"},
				Ops: []LocalOp{{Local: 0, Remote: 1, LocalOff: 0x10, RemoteOff: 0x20, Len: 0x30}}}, false, 0),
			want: hexBytes(
				"SG", 1, 130, 0, 0, 0, 0, 69, 0, 0, 0, 0, 0, 0, 0,
				5, 0, 0, 0, 0, 0, 0, 0, // req
				1, 0, "r", // route
				1,         // dir push
				1,         // checksum on
				1, 0, "t", // tag
				1, 0, 0, 0, 1, 0, "a", // local names
				2, 0, 0, 0, 1, 0, "b", 1, 0, "c", // remote names
				1, 0, 0, 0, // ops
				0, 0, 0, 0, 1, 0, 0, 0,
				0x10, 0, 0, 0, 0, 0, 0, 0,
				0x20, 0, 0, 0, 0, 0, 0, 0,
				0x30, 0, 0, 0, 0, 0, 0, 0,
			),
		},
		{
			name: "SubmitPeer",
			got: AppendFrame(nil, &Submit{Req: 5, Route: "r", Dir: Push, Checksum: ChecksumOn, Tag: "t",
				LocalNames: []string{"a"}, RemoteNames: []string{"b", "c"},
				Ops: []LocalOp{{Local: 0, Remote: 1, LocalOff: 0x10, RemoteOff: 0x20, Len: 0x30}}, Peer: "d1"}, false, 0),
			want: hexBytes(
				"SG", 1, 130, 0, 0, 0, 0, 73, 0, 0, 0, 0, 0, 0, 0,
				5, 0, 0, 0, 0, 0, 0, 0, // req
				1, 0, "r", // route
				1,         // dir push
				1,         // checksum on
				1, 0, "t", // tag
				1, 0, 0, 0, 1, 0, "a", // local names
				2, 0, 0, 0, 1, 0, "b", 1, 0, "c", // remote names
				1, 0, 0, 0, // ops
				0, 0, 0, 0, 1, 0, 0, 0,
				0x10, 0, 0, 0, 0, 0, 0, 0,
				0x20, 0, 0, 0, 0, 0, 0, 0,
				0x30, 0, 0, 0, 0, 0, 0, 0,
				2, 0, "d1", // peer
			),
		},
		{
			name: "Unregister",
			got:  AppendFrame(nil, &Unregister{Req: 0x100, Name: "kv"}, false, 0),
			want: hexBytes("SG", 1, 129, 0, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 2, 0, "kv"),
		},
		{
			name: "UnregisterWait",
			got:  AppendFrame(nil, &Unregister{Req: 0x100, Name: "kv", WaitMs: 10000}, false, 0),
			want: hexBytes(
				"SG", 1, 129, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, // header: length 16
				0, 1, 0, 0, 0, 0, 0, 0, // req
				2, 0, "kv", // name
				0x10, 0x27, 0, 0, // wait 10000 ms
			),
		},
		{
			name: "Fail",
			got:  AppendFrame(nil, &Fail{Req: 0x100, Code: CodeBusy, Message: "no"}, false, 0),
			want: hexBytes("SG", 1, 141, 0, 0, 0, 0, 14, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 12, 0, 2, 0, "no"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !bytes.Equal(tt.got, tt.want) {
				t.Fatalf("got  %x\nwant %x", tt.got, tt.want)
			}
		})
	}
}

// The standard CRC32C check value: "123456789" -> 0xE3069283.
func TestCRCGolden(t *testing.T) {
	if got, want := ChunkCRC([]byte("1234"), []byte("56789")), uint32(0xE3069283); got != want {
		t.Fatalf("ChunkCRC: got %08x, want %08x", got, want)
	}
	m := &Goodbye{Reason: "x"}
	f := AppendFrame(nil, m, true, 0)
	if got, want := le.Uint32(f[12:]), ChunkCRC(f[HeaderSize:], nil); got != want {
		t.Fatalf("frame CRC: got %08x, want %08x", got, want)
	}
}

func TestDecodeTruncated(t *testing.T) {
	for _, s := range samples() {
		t.Run(s.name, func(t *testing.T) {
			body := s.m.AppendBody(nil)
			tail := optionalTail(s.m, len(body))
			for n := 0; n < len(body); n++ {
				m, err := Decode(s.m.Type(), body[:n:n])
				if n == tail {
					// Cut just before the optional tail: a Submit naming no
					// peer, an Unregister that waits for nothing.
					if err != nil || hasTail(m) {
						t.Fatalf("prefix without the optional tail: got %#v, %v; want one without it", m, err)
					}
					continue
				}
				if err == nil {
					t.Fatalf("prefix of %d/%d bytes: got %#v, want an error", n, len(body), m)
				}
				if m != nil {
					t.Fatalf("prefix of %d bytes: got message %#v with error, want nil", n, m)
				}
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("prefix of %d bytes: got %v, want ErrMalformed", n, err)
				}
			}
		})
	}
}

func TestDecodeTrailing(t *testing.T) {
	for _, s := range samples() {
		t.Run(s.name, func(t *testing.T) {
			body := append(s.m.AppendBody(nil), 0)
			m, err := Decode(s.m.Type(), body)
			if !errors.Is(err, ErrMalformed) || m != nil {
				t.Fatalf("got %v, %v; want nil, ErrMalformed", m, err)
			}
			// A Submit naming no peer reads the extra byte as its optional
			// Peer's length, an Unregister without WaitMs as its WaitMs.
			if !strings.Contains(err.Error(), "trailing") && !(optionalTail(s.m, len(body)-1) < 0 && tailField(err)) {
				t.Fatalf("got %q, want it to mention trailing bytes", err)
			}
		})
	}
}

// optionalTail is where the optional tail of a message (a Submit's Peer,
// an Unregister's WaitMs) starts in its body of n bytes: -1 when it has
// none.
func optionalTail(m Msg, n int) int {
	if p := peerOf(m); p != "" {
		return n - strSize(p)
	}
	if u, ok := m.(*Unregister); ok && u.WaitMs != 0 {
		return n - 4
	}
	if k := keyOf(m); k != nil {
		return n - 2 - len(k)
	}
	return -1
}

// hasTail reports whether m carries its optional tail.
func hasTail(m Msg) bool {
	if u, ok := m.(*Unregister); ok {
		return u.WaitMs != 0
	}
	return peerOf(m) != "" || keyOf(m) != nil
}

// tailField reports whether err is about an optional tail's field.
func tailField(err error) bool {
	for _, f := range []string{"Submit.Peer:", "SubmitWait.Peer:", "SubmitHead.Peer:", "Unregister.WaitMs:", "SubmitKV.Key:", "KVAnnounce.Key:", "KVPull.Key:"} {
		if strings.Contains(err.Error(), f) {
			return true
		}
	}
	return false
}

// peerOf is the Peer of a Submit or SubmitWait, "" for anything else.
func peerOf(m Msg) string {
	switch m := m.(type) {
	case *Submit:
		return m.Peer
	case *SubmitWait:
		return m.Peer
	case *SubmitHead:
		return m.Peer
	}
	return ""
}

// body builds test bodies with the package's own primitives.
type body []byte

func (b body) u8(v uint8) body    { return appendU8(b, v) }
func (b body) u16(v uint16) body  { return appendU16(b, v) }
func (b body) u32(v uint32) body  { return appendU32(b, v) }
func (b body) u64(v uint64) body  { return appendU64(b, v) }
func (b body) str(s string) body  { return appendStr(b, s) }
func (b body) raw(p ...byte) body { return append(b, p...) }
func (b body) zeros(n int) body   { return append(b, make([]byte, n)...) }
func (b body) strs(ss ...string) body {
	return appendStrs(b, ss)
}

// submitHead is a Submit body up to and including its name lists.
func submitHead(local, remote []string) body {
	return body(nil).u64(1).str("r").u8(uint8(Push)).u8(0).str("t").strs(local...).strs(remote...)
}

func localOp(l, r uint32, lo, ro, n uint64) body {
	return body(nil).u32(l).u32(r).u64(lo).u64(ro).u64(n)
}

func TestDecodeRejects(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	tests := []struct {
		name string
		t    Type
		body []byte
		want error
		msg  string // substring of the error
	}{
		{"unknown type", 99, nil, ErrUnknownType, "type 99"},
		{"unknown type 0", 0, nil, ErrUnknownType, ""},
		{"chunk", TypeChunk, make([]byte, 40), ErrUnknownType, "DecodeChunkFixed"},
		{"empty body", TypeOK, nil, ErrMalformed, "OK.Req: need 8 bytes at offset 0, have 0"},
		{"ops over limit", TypeSubmit, append(submitHead(nil, nil), body(nil).u32(5000000)...), ErrTooLarge,
			"wire: Submit.Ops: count 5000000 exceeds limit 1048576: frame too large"},
		{"peer empty", TypeSubmit, append(submitHead(nil, nil), body(nil).u32(0).str("")...), ErrMalformed,
			"Submit.Peer: present but empty"},
		{"peer over limit", TypeSubmit, append(submitHead(nil, nil), body(nil).u32(0).str(long(MaxName+1))...), ErrTooLarge,
			"Submit.Peer: length 256 exceeds limit 255"},
		{"peer cut short", TypeSubmit, append(submitHead(nil, nil), body(nil).u32(0).u16(5).u8('x')...), ErrMalformed,
			"Submit.Peer"},
		{"ops over bytes", TypeSubmit, append(submitHead(nil, nil), body(nil).u32(3).zeros(64)...), ErrMalformed,
			"Submit.Ops: count 3 needs at least 96 bytes, 64 remain"},
		{"ack chunks 2^32-1", TypeAck, body(nil).u64(1).u32(math.MaxUint32).zeros(2), ErrTooLarge, "Ack.Chunks: count 4294967295"},
		{"resend short", TypeResend, body(nil).u64(1).u16(0), ErrMalformed, "Resend.Chunk"},
		{"resend trailing", TypeResend, body(nil).u64(1).u32(2).u8(0), ErrMalformed, "trailing"},
		{"ack chunks over bytes", TypeAck, body(nil).u64(1).u32(MaxAckChunks).zeros(8), ErrMalformed, "Ack.Chunks"},
		{"names over limit", TypeAnnounce, body(nil).u64(1).str("").u64(0).u32(MaxNames + 1), ErrTooLarge, "Announce.Regions: count 4097 exceeds limit 4096"},
		{"regions over limit", TypeCatalog, body(nil).u64(1).u32(MaxRegions + 1), ErrTooLarge, "Catalog.Regions"},
		{"regions over bytes", TypeCatalog, body(nil).u64(1).u32(2).zeros(25), ErrMalformed, "Catalog.Regions: count 2 needs at least 26 bytes"},
		{"tag over limit", TypeAnnounce, body(nil).u64(1).str(long(MaxTag + 1)), ErrTooLarge, "Announce.Tag: length 1025 exceeds limit 1024"},
		{"tag at limit ok, truncated after", TypeAnnounce, body(nil).u64(1).str(long(MaxTag)), ErrMalformed, "Announce.Total"},
		{"name over limit", TypeUnregister, body(nil).u64(1).str(long(MaxName + 1)), ErrTooLarge, "Unregister.Name: length 256"},
		{"name over bytes", TypeUnregister, body(nil).u64(1).u16(10).raw('a', 'b'), ErrMalformed, "Unregister.Name: need 10 bytes at offset 10, have 2"},
		{"wait zero", TypeUnregister, body(nil).u64(1).str("kv").u32(0), ErrMalformed, "Unregister.WaitMs: present but 0"},
		{"wait cut short", TypeUnregister, body(nil).u64(1).str("kv").u16(7), ErrMalformed, "Unregister.WaitMs: need 4 bytes"},
		{"wait trailing", TypeUnregister, body(nil).u64(1).str("kv").u32(7).u8(0), ErrMalformed, "trailing"},
		{"message over limit", TypeFail, body(nil).u64(1).u16(0).u16(MaxMessage + 1), ErrTooLarge, "Fail.Message"},
		{"handle over limit", TypeRegister, body(nil).u64(1).str("n").u8(0).u8(0).u32(0).zeros(32).u16(MaxHandleBytes + 1), ErrTooLarge, "Register.HandleRaw: length 65529 exceeds limit 65528"},
		{"json over limit", TypeQueryReply, body(nil).u64(1).u32(MaxJSON + 1), ErrTooLarge, "QueryReply.JSON: length 8388609 exceeds limit 8388608"},
		{"json over bytes", TypeQueryReply, body(nil).u64(1).u32(100).raw('{'), ErrMalformed, "QueryReply.JSON"},
		{"json 2^32-1", TypeQueryReply, body(nil).u64(1).u32(math.MaxUint32), ErrTooLarge, "QueryReply.JSON"},
		{"string list element over limit", TypeSubmit, body(nil).u64(1).str("r").u8(1).u8(0).str("").u32(2).str("a").str(long(MaxName + 1)), ErrTooLarge, "Submit.LocalNames[1]: length 256"},
		{"op len 0", TypeSubmit, append(submitHead([]string{"a"}, []string{"b"}), body(nil).u32(2).raw(localOp(0, 0, 0, 0, 1)...).raw(localOp(0, 0, 0, 0, 0)...)...), ErrMalformed, "Submit.Ops[1].Len: zero length"},
		{"op local index", TypeSubmit, append(submitHead([]string{"a"}, []string{"b"}), body(nil).u32(1).raw(localOp(1, 0, 0, 0, 1)...)...), ErrMalformed, "Submit.Ops[0].Local: index 1 out of range (1 local names)"},
		{"op remote index", TypeSubmit, append(submitHead([]string{"a"}, []string{"b", "c"}), body(nil).u32(1).raw(localOp(0, 2, 0, 0, 1)...)...), ErrMalformed, "Submit.Ops[0].Remote: index 2"},
		{"op index no names", TypeSubmit, append(submitHead(nil, nil), body(nil).u32(1).raw(localOp(0, 0, 0, 0, 1)...)...), ErrMalformed, "Submit.Ops[0].Local"},
		{"op index max", TypeSubmit, append(submitHead([]string{"a"}, []string{"b"}), body(nil).u32(1).raw(localOp(math.MaxUint32, 0, 0, 0, 1)...)...), ErrMalformed, "index 4294967295"},
		{"op offset overflow", TypeSubmit, append(submitHead([]string{"a"}, []string{"b"}), body(nil).u32(1).raw(localOp(0, 0, math.MaxUint64, 0, 1)...)...), ErrMalformed, "Submit.Ops[0].LocalOff"},
		{"dir 0", TypeSubmit, body(nil).u64(1).str("r").u8(0), ErrMalformed, "Submit.Dir: unknown direction 0"},
		{"dir 3", TypeNotify, body(nil).u64(1).str("p").str("").str("").u8(3), ErrMalformed, "Notify.Dir: unknown direction 3"},
		{"checksum 3", TypeSubmit, body(nil).u64(1).str("r").u8(1).u8(3), ErrMalformed, "Submit.Checksum"},
		{"state 0", TypeXferStatus, body(nil).u64(1).u64(2).u8(0), ErrMalformed, "XferStatus.State: unknown state 0"},
		{"state 5", TypeXferStatus, body(nil).u64(1).u64(2).u8(5), ErrMalformed, "XferStatus.State"},
		{"access bits", TypeRegister, body(nil).u64(1).str("n").u8(0).u8(0x10), ErrMalformed, "Register.Access: unknown access bits 0x10"},
		{"catalog access bits", TypeCatalog, body(nil).u64(1).u32(1).str("n").u64(1).u8(0x80).str("d"), ErrMalformed, "Catalog.Regions[0].Access"},
		{"hello versions", TypeHello, body(nil).u8(2).u8(1), ErrMalformed, "Hello.VersionMin: 2 above VersionMax 1"},
		{"pull src index", TypePullRequest, body(nil).u64(1).str("").strs("a").u32(1).u32(1).u32(0).u64(0).u64(0).u64(1), ErrMalformed, "PullRequest.Ops[0].Src: index 1 out of range (1 source regions)"},
		{"pull len 0", TypePullRequest, body(nil).u64(1).str("").strs("a").u32(1).u32(0).u32(9).u64(0).u64(0).u64(0), ErrMalformed, "PullRequest.Ops[0].Len: zero length"},
		{"pull dst overflow", TypePullRequest, body(nil).u64(1).str("").strs("a").u32(1).u32(0).u32(9).u64(0).u64(math.MaxUint64 - 1).u64(2), ErrMalformed, "PullRequest.Ops[0].DstOff"},
		{"announce ends mismatch", TypeAnnounce, body(nil).u64(1).str("").u64(0).strs("a", "b").u32(1).u64(5), ErrMalformed, "Announce.Ends: count 1, want 2"},
		{"body over MaxControlBody", TypeOK, make([]byte, MaxControlBody+1), ErrTooLarge, "OK: body of"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Decode(tt.t, tt.body)
			if m != nil {
				t.Fatalf("got message %#v, want nil", m)
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("got error %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got error %q, want it to contain %q", err, tt.msg)
			}
		})
	}
}

// allocBytes reports the bytes f allocates per call, averaged over n calls.
func allocBytes(n int, f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	for i := 0; i < n; i++ {
		f()
	}
	runtime.ReadMemStats(&b)
	return (b.TotalAlloc - a.TotalAlloc) / uint64(n)
}

// A small body that claims a huge list costs a bounded amount of memory:
// counts are checked against the limit and the remaining bytes first.
func TestHugeCountsDoNotAllocate(t *testing.T) {
	tests := []struct {
		name string
		t    Type
		body []byte
	}{
		{"Ack 2^32-1", TypeAck, body(nil).u64(1).u32(math.MaxUint32)},
		{"Ack at limit", TypeAck, body(nil).u64(1).u32(MaxAckChunks).zeros(6)},
		{"Submit ops 2^32-1", TypeSubmit, append(submitHead(nil, nil), body(nil).u32(math.MaxUint32).zeros(6)...)},
		{"Submit ops at limit", TypeSubmit, append(submitHead(nil, nil), body(nil).u32(MaxOps).zeros(6)...)},
		{"Submit names at limit", TypeSubmit, body(nil).u64(1).str("").u8(1).u8(0).str("").u32(MaxNames).zeros(6)},
		{"Catalog at limit", TypeCatalog, body(nil).u64(1).u32(MaxRegions).zeros(6)},
		{"PullRequest ops at limit", TypePullRequest, body(nil).u64(1).str("").u32(0).u32(MaxOps).zeros(6)},
		{"Announce ends at limit", TypeAnnounce, body(nil).u64(1).str("").u64(0).u32(0).u32(MaxNames)},
		{"QueryReply JSON at limit", TypeQueryReply, body(nil).u64(1).u32(MaxJSON).zeros(6)},
		{"Register handle at limit", TypeRegister, body(nil).u64(1).str("n").u8(0).u8(0).u32(0).zeros(32).u16(MaxHandleBytes)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Decode(tt.t, tt.body); err == nil {
				t.Fatalf("got nil error, want one")
			}
			allocs := testing.AllocsPerRun(100, func() { _, _ = Decode(tt.t, tt.body) })
			if allocs > 16 {
				t.Errorf("allocs per decode: got %v, want <= 16", allocs)
			}
			if n := allocBytes(100, func() { _, _ = Decode(tt.t, tt.body) }); n > 1024 {
				t.Errorf("bytes allocated per decode: got %d, want <= 1024", n)
			}
		})
	}
}

func TestErrorsNameFieldAndWrap(t *testing.T) {
	_, err := Decode(TypeSubmit, append(submitHead(nil, nil), body(nil).u32(5000000)...))
	if got, want := err.Error(), "wire: Submit.Ops: count 5000000 exceeds limit 1048576: frame too large"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if !errors.Is(err, ErrTooLarge) || errors.Is(err, ErrMalformed) {
		t.Fatalf("errors.Is: got %v, want ErrTooLarge only", err)
	}
}

func TestTextIsClipped(t *testing.T) {
	tests := []struct {
		name string
		msg  string
		want string
	}{
		{"ascii", strings.Repeat("a", MaxMessage+100), strings.Repeat("a", MaxMessage)},
		{"at limit", strings.Repeat("b", MaxMessage), strings.Repeat("b", MaxMessage)},
		// "é" is 2 bytes; cutting at 4096 would split the last one.
		{"utf8", "x" + strings.Repeat("é", MaxMessage/2), "x" + strings.Repeat("é", MaxMessage/2-1)},
		// "€" is 3 bytes
		{"utf8-3", strings.Repeat("€", MaxMessage), strings.Repeat("€", MaxMessage/3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, m := range []Msg{&Nack{Message: tt.msg}, &Error{Message: tt.msg}, &Goodbye{Reason: tt.msg},
				&XferStatus{State: StateDone, Message: tt.msg}, &Notify{Dir: Push, Message: tt.msg}, &Fail{Message: tt.msg}} {
				got, err := Decode(m.Type(), m.AppendBody(nil))
				if err != nil {
					t.Fatalf("%s: got error %v, want nil", m.Type(), err)
				}
				var text string
				switch g := got.(type) {
				case *Nack:
					text = g.Message
				case *Error:
					text = g.Message
				case *Goodbye:
					text = g.Reason
				case *XferStatus:
					text = g.Message
				case *Notify:
					text = g.Message
				case *Fail:
					text = g.Message
				}
				if text != tt.want {
					t.Fatalf("%s: got %d bytes, want %d", m.Type(), len(text), len(tt.want))
				}
			}
		})
	}
}

// A string longer than its u16 prefix can say is refused by the decoder,
// never misread as the fields after it.
func TestOversizeFieldsAreRejected(t *testing.T) {
	huge := strings.Repeat("n", 70000)
	tests := []struct {
		name string
		m    Msg
	}{
		{"name", &Unregister{Req: 1, Name: huge}},
		{"tag", &Submit{Req: 1, Route: "r", Dir: Push, Tag: huge + "\x01\x00\x00\x00"}},
		{"handle", &Register{Req: 1, Name: "n", HandleRaw: []byte(huge)}},
		{"name just over", &Unregister{Req: 1, Name: huge[:MaxName+1]}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Decode(tt.m.Type(), tt.m.AppendBody(nil))
			if !errors.Is(err, ErrTooLarge) || m != nil {
				t.Fatalf("got %v, %v; want nil, ErrTooLarge", m, err)
			}
		})
	}
}

func TestAckZeroAlloc(t *testing.T) {
	a := &Ack{Transfer: 5, Chunks: []uint32{1, 2, 3, 4, 5, 6, 7, 8}}
	dst := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { dst = a.AppendBody(dst[:0]) }); n != 0 {
		t.Errorf("Ack.AppendBody: got %v allocs, want 0", n)
	}
	var m Msg = a
	if n := testing.AllocsPerRun(100, func() { dst = AppendFrame(dst[:0], m, true, 0) }); n != 0 {
		t.Errorf("AppendFrame(Ack): got %v allocs, want 0", n)
	}
	var got Ack
	got.Chunks = make([]uint32, 0, 16)
	body := dst[HeaderSize:]
	if n := testing.AllocsPerRun(100, func() {
		if err := DecodeAck(body, &got); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("DecodeAck: got %v allocs, want 0", n)
	}
	if !reflect.DeepEqual(got.Chunks, a.Chunks) || got.Transfer != a.Transfer {
		t.Fatalf("DecodeAck: got %+v, want %+v", got, *a)
	}
}

func TestDecodeAck(t *testing.T) {
	tests := []struct {
		name    string
		body    []byte
		want    Ack
		wantErr error
	}{
		{"two", (&Ack{Transfer: 3, Chunks: []uint32{7, 8}}).AppendBody(nil), Ack{Transfer: 3, Chunks: []uint32{7, 8}}, nil},
		{"none", (&Ack{Transfer: 4}).AppendBody(nil), Ack{Transfer: 4, Chunks: []uint32{}}, nil},
		{"trailing", append((&Ack{Transfer: 4}).AppendBody(nil), 1), Ack{Chunks: []uint32{}}, ErrMalformed},
		{"too many", body(nil).u64(1).u32(MaxAckChunks + 1), Ack{Chunks: []uint32{}}, ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := Ack{Transfer: 99, Chunks: make([]uint32, 3, 8)}
			err := DecodeAck(tt.body, &a)
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("error: got %v, want %v", err, tt.wantErr)
			}
			if !reflect.DeepEqual(a, tt.want) {
				t.Fatalf("got %+v, want %+v", a, tt.want)
			}
			if cap(a.Chunks) != 8 {
				t.Fatalf("capacity: got %d, want 8 (reused)", cap(a.Chunks))
			}
		})
	}
}

// TestSubmitAppendsOnce: a Submit's body is grown once to its exact size,
// so encoding a push of many ops into a buffer with room allocates nothing
// and into a nil buffer allocates once, long names included.
func TestSubmitAppendsOnce(t *testing.T) {
	long := strings.Repeat("x", math.MaxUint16+10)
	for _, tc := range []struct {
		name string
		m    *Submit
	}{
		{"no ops", &Submit{Req: 1, Route: "r", Dir: Push}},
		{"scattered", scatteredSubmit(1000)},
		{"long names", &Submit{Route: long, Tag: "t", LocalNames: []string{"a", long}, RemoteNames: []string{long}, Ops: []LocalOp{{Len: 1}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := tc.m.AppendBody(nil)
			if want := tc.m.headSize() + 4 + len(tc.m.Ops)*localOpSize; len(body) != want {
				t.Fatalf("body of %d B, want %d", len(body), want)
			}
			if n := testing.AllocsPerRun(10, func() { _ = tc.m.AppendBody(nil) }); n != 1 {
				t.Errorf("got %v allocations into a nil buffer, want 1", n)
			}
			dst := make([]byte, 0, len(body))
			if n := testing.AllocsPerRun(10, func() { _ = tc.m.AppendBody(dst) }); n != 0 {
				t.Errorf("got %v allocations into a buffer with room, want 0", n)
			}
		})
	}
}

// TestSubmitManyOpsRoundTrip decodes a large push op for op, and checks
// that a bad op deep in the list is named by its index.
func TestSubmitManyOpsRoundTrip(t *testing.T) {
	m := scatteredSubmit(4096)
	got, err := Decode(TypeSubmit, m.AppendBody(nil))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatal("decoded Submit differs from the one encoded")
	}
	for _, tc := range []struct {
		name string
		bad  func(op *LocalOp)
		kind error
		want string
	}{
		{"local index", func(op *LocalOp) { op.Local = 1 }, ErrMalformed, "Submit.Ops[4000].Local: index 1 out of range (1 local names)"},
		{"remote index", func(op *LocalOp) { op.Remote = 7 }, ErrMalformed, "Submit.Ops[4000].Remote: index 7 out of range (1 remote names)"},
		{"zero length", func(op *LocalOp) { op.Len = 0 }, ErrMalformed, "Submit.Ops[4000].Len: zero length"},
		{"local overflow", func(op *LocalOp) { op.LocalOff = math.MaxUint64 - 5 }, ErrOverflow, "Submit.Ops[4000].LocalOff: offset 18446744073709551610 + length 16384 overflows"},
		{"remote overflow", func(op *LocalOp) { op.RemoteOff = math.MaxUint64 }, ErrOverflow, "Submit.Ops[4000].RemoteOff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := scatteredSubmit(4096)
			tc.bad(&b.Ops[4000])
			got, err := Decode(TypeSubmit, b.AppendBody(nil))
			if got != nil || !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, %v; want nil and %v naming %q", got, err, tc.kind, tc.want)
			}
		})
	}
}
