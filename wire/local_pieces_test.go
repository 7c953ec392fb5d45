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

func TestFlagMoreOnlyOnSubmit(t *testing.T) {
	for _, tc := range []struct {
		t  Type
		ok bool
	}{
		{TypeSubmit, true}, {TypeSubmitWait, true}, {TypeSubmitMore, false}, {TypeSubmitKV, false}, {TypeRegister, false}, {TypeAnnounce, false},
	} {
		_, err := ParseHeader(AppendHeader(nil, Header{Version: 1, Type: tc.t, Flags: FlagMore, Length: 8}))
		if (err == nil) != tc.ok {
			t.Errorf("%s with FlagMore: got error %v, want ok %v", tc.t, err, tc.ok)
		}
	}
}

// FuzzSubmitMore decodes arbitrary SubmitMore bodies: an error wraps a
// sentinel, and what decodes re-encodes to the same bytes with every op
// non-empty and in range of 2^64.
func FuzzSubmitMore(f *testing.F) {
	for _, s := range piecesSamples() {
		f.Add(s.m.AppendBody(nil))
	}
	f.Add(appendU32(appendBool(appendU64(nil, 1), true), 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(TypeSubmitMore, b)
		if err != nil {
			if m != nil || !sentinel(err) {
				t.Fatalf("got %v, %v; want nil and a sentinel error", m, err)
			}
			return
		}
		sm := m.(*SubmitMore)
		for i, op := range sm.Ops {
			if op.Len == 0 || op.LocalOff > math.MaxUint64-op.Len || op.RemoteOff > math.MaxUint64-op.Len {
				t.Fatalf("op %d %+v decoded", i, op)
			}
		}
		if re := sm.AppendBody(nil); !bytes.Equal(re, b) {
			t.Fatalf("re-encoded body differs:\n got %x\nwant %x", re, b)
		}
		m2, err := Decode(TypeSubmitMore, b)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("re-decode: got %#v, %v", m2, err)
		}
	})
}
