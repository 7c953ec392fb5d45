package fanout

import (
	"sync/atomic"
	"testing"
)

func TestSlices(t *testing.T) {
	for _, tc := range []struct {
		n, min, procs, want int
	}{
		{65536, 8192, 32, 8},
		{65536, 8192, 8, 4},  // half the processors
		{65536, 8192, 2, 1},  // too few processors: serial
		{65536, 8192, 3, 1},  // likewise
		{16384, 8192, 32, 2}, // no slice under min
		{8191, 8192, 32, 1},
		{0, 8192, 32, 1},
		{1 << 20, 8192, 64, MaxSlices},
		{100, 0, 32, 1}, // a bad min: serial
	} {
		if got := Slices(tc.n, tc.min, tc.procs); got != tc.want {
			t.Errorf("Slices(%d, %d, %d) = %d, want %d", tc.n, tc.min, tc.procs, got, tc.want)
		}
	}
}

// Run covers every item exactly once, in contiguous slices in order,
// whatever k is (more slices than items, one, none).
func TestRunCoversEachItemOnce(t *testing.T) {
	for _, tc := range []struct{ n, k int }{{100, 8}, {7, 8}, {1, 1}, {65536, 3}, {10, 0}, {0, 4}} {
		hits := make([]atomic.Int32, tc.n)
		var calls atomic.Int32
		ends := make([][2]int, max(1, min(tc.k, tc.n)))
		Run(tc.n, tc.k, func(j, lo, hi int) {
			calls.Add(1)
			ends[j] = [2]int{lo, hi}
			for i := lo; i < hi; i++ {
				hits[i].Add(1)
			}
		})
		for i := range hits {
			if h := hits[i].Load(); h != 1 {
				t.Fatalf("n %d k %d: item %d run %d times", tc.n, tc.k, i, h)
			}
		}
		if tc.n > 0 {
			for j := 1; j < int(calls.Load()); j++ {
				if ends[j][0] != ends[j-1][1] {
					t.Fatalf("n %d k %d: slice %d starts at %d, the one before ends at %d", tc.n, tc.k, j, ends[j][0], ends[j-1][1])
				}
			}
		}
	}
}
