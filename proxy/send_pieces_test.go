package proxy

import (
	"math"
	"strings"
	"testing"

	"github.com/stage-kv/stage/wire"
)

// TestDeclared: a piece's ops are held to what the head declared, with
// overflow-safe sums.
func TestDeclared(t *testing.T) {
	m := &wire.SubmitHead{Submit: wire.Submit{RemoteNames: []string{"a", "b"}}, Total: 100, Ends: []uint64{50, math.MaxUint64}}
	op := func(r uint32, off, n uint64) wire.LocalOp { return wire.LocalOp{Remote: r, RemoteOff: off, Len: n} }
	for _, tc := range []struct {
		name string
		have uint64
		ops  []wire.LocalOp
		want uint64
		code wire.Code
		msg  string
	}{
		{"within", 0, []wire.LocalOp{op(0, 0, 50), op(1, 1000, 50)}, 100, 0, ""},
		{"none", 40, nil, 40, 0, ""},
		{"at the end", 0, []wire.LocalOp{op(0, 49, 1)}, 1, 0, ""},
		{"past the end", 0, []wire.LocalOp{op(0, 49, 2)}, 0, wire.CodeOutOfRange, `region "a"`},
		{"longer than the end", 0, []wire.LocalOp{op(0, 0, 51)}, 0, wire.CodeOutOfRange, "Ends[0]"},
		{"huge offset", 0, []wire.LocalOp{op(0, math.MaxUint64-1, 1)}, 0, wire.CodeOutOfRange, "Ends[0]"},
		{"past the total", 60, []wire.LocalOp{op(1, 0, 30), op(1, 0, 11)}, 0, wire.CodeOutOfRange, "Total"},
		{"huge length", 1, []wire.LocalOp{op(1, 0, math.MaxUint64)}, 0, wire.CodeOutOfRange, "Total"},
		{"remote index", 0, []wire.LocalOp{op(2, 0, 1)}, 0, wire.CodeBadRequest, "#2 of 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := declared(m, tc.have, tc.ops)
			if tc.code == 0 {
				if err != nil || got != tc.want {
					t.Fatalf("got %d, %v; want %d", got, err, tc.want)
				}
				return
			}
			if err == nil || errCode(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %d, %v; want code %s naming %q", got, err, tc.code, tc.msg)
			}
		})
	}
}
