package region

import (
	"math"
	"testing"

	"github.com/stage-kv/stage/wire"
)

func TestInRange(t *testing.T) {
	const M = math.MaxUint64
	for _, tc := range []struct {
		off, n, size uint64
		want         bool
	}{
		{0, 0, 0, true},
		{0, 10, 10, true},
		{1, 10, 10, false},
		{10, 0, 10, true},
		{11, 0, 10, false},
		{5, 5, 10, true},
		{M, 1, 10, false},
		{1, M, 10, false},
		{M - 5, 10, M, false}, // off+n wraps around to a small number
		{10, M - 5, M, false},
		{M - 10, 10, M, true},
		{0, M, M, true},
	} {
		if got := InRange(tc.off, tc.n, tc.size); got != tc.want {
			t.Errorf("InRange(%d, %d, %d) = %v, want %v", tc.off, tc.n, tc.size, got, tc.want)
		}
	}
}

func TestAccessString(t *testing.T) {
	for _, tc := range []struct {
		a    wire.Access
		want string
	}{
		{0, "none"},
		{wire.AccessRemoteWrite, "remote-write"},
		{wire.AccessLocalRead | wire.AccessRemoteRead, "local-read+remote-read"},
	} {
		if got := AccessString(tc.a); got != tc.want {
			t.Errorf("AccessString(%#x) = %q, want %q", tc.a, got, tc.want)
		}
	}
}
