package wire

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

func piecesSamples() []sample {
	return []sample{
		{"SubmitMore", &SubmitMore{Req: 40, Ops: []LocalOp{{Local: 0, Remote: 1, LocalOff: 1 << 20, RemoteOff: 1 << 30, Len: 16 << 10}}}},
		{"SubmitMoreEnd", &SubmitMore{Req: 41, End: true, Ops: []LocalOp{{Local: 7, Remote: 9, Len: 1}, {LocalOff: math.MaxUint64 - 1, Len: 1}}}},
		{"SubmitMoreEndEmpty", &SubmitMore{Req: 42, End: true}},
		{"SubmitHead", &SubmitHead{Submit: Submit{Req: 43, Route: "decode", Dir: Push, Checksum: ChecksumOff, Tag: "blocks", LocalNames: []string{"kv0"},
			RemoteNames: []string{"kv1", "kv2"}, Ops: []LocalOp{{Local: 0, Remote: 1, LocalOff: 4096, RemoteOff: 8192, Len: 16384}}},
			Wait: true, Total: 1 << 30, Ends: []uint64{0, 1 << 31}}},
		{"SubmitHeadPeerNoOps", &SubmitHead{Submit: Submit{Req: 44, Route: "r", Dir: Pull, LocalNames: []string{"a"}, RemoteNames: []string{"b"}, Peer: "d1"},
			Total: 5, Ends: []uint64{5}}},
	}
}

func TestSubmitMoreGolden(t *testing.T) {
	got := AppendFrame(nil, &SubmitMore{Req: 5, End: true, Ops: []LocalOp{{Local: 0, Remote: 1, LocalOff: 0x10, RemoteOff: 0x20, Len: 0x30}}}, false, 0)
	want := hexBytes(
		"SG", 1, 160, 0, 0, 0, 0, 45, 0, 0, 0, 0, 0, 0, 0, // header: type 160, length 45
		5, 0, 0, 0, 0, 0, 0, 0, // Req
		1,          // End
		1, 0, 0, 0, // Ops count
		0, 0, 0, 0, 1, 0, 0, 0, // Local 0, Remote 1
		0x10, 0, 0, 0, 0, 0, 0, 0, // LocalOff
		0x20, 0, 0, 0, 0, 0, 0, 0, // RemoteOff
		0x30, 0, 0, 0, 0, 0, 0, 0, // Len
	)
	if !bytes.Equal(got, want) {
		t.Fatalf("SubmitMore frame:\n got %x\nwant %x", got, want)
	}
}

func TestSubmitMoreRefused(t *testing.T) {
	op := func(off, n uint64) []byte {
		return (&SubmitMore{Req: 1, Ops: []LocalOp{{LocalOff: off, Len: n}}}).AppendBody(nil)
	}
	badEnd := op(0, 1)
	badEnd[8] = 2
	tooMany := appendU32(appendBool(appendU64(nil, 1), false), MaxOps+1)
	for _, tc := range []struct {
		name string
		body []byte
		want error
		msg  string
	}{
		{"end not boolean", badEnd, ErrMalformed, "End"},
		{"zero length", op(0, 0), ErrMalformed, "Ops[0].Len"},
		{"offset overflows", op(math.MaxUint64, 1), ErrOverflow, "LocalOff"},
		{"too many ops", tooMany, ErrTooLarge, "Ops"},
		{"short ops", tooMany[:len(tooMany)-1], ErrMalformed, "SubmitMore"},
		{"trailing", append(op(0, 1), 0), ErrMalformed, "trailing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode(TypeSubmitMore, tc.body)
			if m != nil || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Decode: got %v, %v; want nil and %v naming %q", m, err, tc.want, tc.msg)
			}
		})
	}
}

func TestSubmitHeadGolden(t *testing.T) {
	m := &SubmitHead{Submit: Submit{Req: 5, Route: "r", Dir: Push, Checksum: ChecksumOn, Tag: "t", LocalNames: []string{"a"}, RemoteNames: []string{"b", "c"},
		Ops: []LocalOp{{Local: 0, Remote: 1, LocalOff: 0x10, RemoteOff: 0x20, Len: 0x30}}}, Total: 0x1000, Ends: []uint64{0, 0x2000}}
	got := AppendFrame(nil, m, false, 0)
	want := hexBytes(
		"SG", 1, 161, 0, 0, 0, 0, 98, 0, 0, 0, 0, 0, 0, 0, // header: type 161, length 98
		5, 0, 0, 0, 0, 0, 0, 0, // Req
		0,                         // Wait: answer Submitted
		0, 0x10, 0, 0, 0, 0, 0, 0, // Total 0x1000
		2, 0, 0, 0, // Ends count
		0, 0, 0, 0, 0, 0, 0, 0, // Ends[0]
		0, 0x20, 0, 0, 0, 0, 0, 0, // Ends[1] 0x2000
		1, 0, "r", 1, 1, 1, 0, "t", // Route, Dir, Checksum, Tag
		1, 0, 0, 0, 1, 0, "a", // LocalNames
		2, 0, 0, 0, 1, 0, "b", 1, 0, "c", // RemoteNames
		1, 0, 0, 0, // Ops count
		0, 0, 0, 0, 1, 0, 0, 0, // Local 0, Remote 1
		0x10, 0, 0, 0, 0, 0, 0, 0, // LocalOff
		0x20, 0, 0, 0, 0, 0, 0, 0, // RemoteOff
		0x30, 0, 0, 0, 0, 0, 0, 0, // Len
	)
	if !bytes.Equal(got, want) {
		t.Fatalf("SubmitHead frame:\n got %x\nwant %x", got, want)
	}
	// The same with a Peer: it stays last, as in Submit.
	m.Peer = "d1"
	if got := AppendFrame(nil, m, false, 0); !bytes.Equal(got[HeaderSize:], append(want[HeaderSize:], 2, 0, 'd', '1')) {
		t.Fatalf("SubmitHead with Peer: got %x", got)
	}
}

func TestSubmitHeadRefused(t *testing.T) {
	head := func(f func(*SubmitHead)) []byte {
		m := &SubmitHead{Submit: Submit{Req: 1, Route: "r", Dir: Push, LocalNames: []string{"a"}, RemoteNames: []string{"b"},
			Ops: []LocalOp{{Len: 1}}}, Total: 2, Ends: []uint64{2}}
		f(m)
		return m.AppendBody(nil)
	}
	badWait := head(func(*SubmitHead) {})
	badWait[8] = 7
	for _, tc := range []struct {
		name string
		body []byte
		want error
		msg  string
	}{
		{"wait not boolean", badWait, ErrMalformed, "Wait"},
		{"zero total", head(func(m *SubmitHead) { m.Total = 0 }), ErrMalformed, "Total"},
		{"ends short", head(func(m *SubmitHead) { m.Ends = nil }), ErrMalformed, "one per remote name"},
		{"ends long", head(func(m *SubmitHead) { m.Ends = []uint64{1, 2} }), ErrMalformed, "one per remote name"},
		{"op index", head(func(m *SubmitHead) { m.Ops[0].Remote = 1 }), ErrMalformed, "Ops[0].Remote"},
		{"op overflow", head(func(m *SubmitHead) { m.Ops[0].RemoteOff = math.MaxUint64 }), ErrOverflow, "RemoteOff"},
		{"empty peer", append(head(func(*SubmitHead) {}), 0, 0), ErrMalformed, "Peer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode(TypeSubmitHead, tc.body)
			if m != nil || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Decode: got %v, %v; want nil and %v naming %q", m, err, tc.want, tc.msg)
			}
		})
	}
}

// FuzzSubmitPieces decodes arbitrary SubmitHead (head true) and SubmitMore
// bodies: an error wraps a sentinel, and what decodes re-encodes to the
// same bytes with every op non-empty and in range of 2^64 (and, for a
// head, one End per remote name and a non-zero Total).
func FuzzSubmitPieces(f *testing.F) {
	for _, s := range piecesSamples() {
		f.Add(s.m.Type() == TypeSubmitHead, s.m.AppendBody(nil))
	}
	f.Add(false, appendU32(appendBool(appendU64(nil, 1), true), 3))
	f.Fuzz(func(t *testing.T, head bool, b []byte) {
		typ := TypeSubmitMore
		if head {
			typ = TypeSubmitHead
		}
		m, err := Decode(typ, b)
		if err != nil {
			if m != nil || !sentinel(err) {
				t.Fatalf("got %v, %v; want nil and a sentinel error", m, err)
			}
			return
		}
		var ops []LocalOp
		if h, ok := m.(*SubmitHead); ok {
			if len(h.Ends) != len(h.RemoteNames) || h.Total == 0 {
				t.Fatalf("head %+v decoded", h)
			}
			ops = h.Ops
		} else {
			ops = m.(*SubmitMore).Ops
		}
		for i, op := range ops {
			if op.Len == 0 || op.LocalOff > math.MaxUint64-op.Len || op.RemoteOff > math.MaxUint64-op.Len {
				t.Fatalf("op %d %+v decoded", i, op)
			}
		}
		if re := m.AppendBody(nil); !bytes.Equal(re, b) {
			t.Fatalf("re-encoded body differs:\n got %x\nwant %x", re, b)
		}
		m2, err := Decode(typ, b)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("re-decode: got %#v, %v", m2, err)
		}
	})
}
