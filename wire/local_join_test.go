package wire

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func joinSamples() []sample {
	return []sample{
		{"Join", &Join{Req: 30, Group: []byte("0123456789abcdef-engine-7")}},
		{"JoinMax", &Join{Req: 31, Group: bytes.Repeat([]byte{0xfe}, MaxGroup)}},
		{"JoinEmpty", &Join{Req: 32}}, // decodes; the sidecar refuses it (shorter than MinGroup)
	}
}

func TestJoinGolden(t *testing.T) {
	got := AppendFrame(nil, &Join{Req: 0x100, Group: []byte("0123456789abcdef")}, false, 0)
	want := hexBytes(
		"SG", 1, 153, 0, 0, 0, 0, 26, 0, 0, 0, 0, 0, 0, 0, // header: type 153, length 26
		0, 1, 0, 0, 0, 0, 0, 0, // Req
		16, 0, "0123456789abcdef", // Group
	)
	if !bytes.Equal(got, want) {
		t.Fatalf("Join frame:\n got %x\nwant %x", got, want)
	}
}

func TestJoinRefused(t *testing.T) {
	long := append(appendU64(nil, 1), appendBytes16(nil, bytes.Repeat([]byte{1}, MaxGroup+1))...)
	for _, tc := range []struct {
		name string
		body []byte
		want error
		msg  string
	}{
		{"too long", long, ErrTooLarge, "Join.Group"},
		{"short", []byte{1, 0, 0}, ErrMalformed, "Join"},
		{"trailing", append((&Join{Req: 1, Group: []byte("x")}).AppendBody(nil), 0), ErrMalformed, "Join"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode(TypeJoin, tc.body)
			if m != nil || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Decode: got %v, %v; want nil and %v naming %q", m, err, tc.want, tc.msg)
			}
		})
	}
}
