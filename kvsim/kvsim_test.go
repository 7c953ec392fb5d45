package kvsim

import (
	"runtime"
	"strings"
	"testing"
)

// pair is a source filled with random bytes and a poisoned destination of
// the same shape, both in host memory.
func pair(t *testing.T, layers int, layerBytes, guard uint64) (src, dst *Cache) {
	t.Helper()
	var err error
	if src, err = New("src", layers, layerBytes, guard); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	if dst, err = New("dst", layers, layerBytes, guard); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dst.Close() })
	if err := src.Fill(7); err != nil {
		t.Fatal(err)
	}
	if err := dst.Poison(0xAB); err != nil {
		t.Fatal(err)
	}
	return src, dst
}

// copyMoves does what a transfer of ms would, through the caches' memory.
func copyMoves(t *testing.T, src, dst *Cache, ms []Move) {
	t.Helper()
	for _, m := range ms {
		b := make([]byte, m.Len)
		if err := src.mem.ReadAt(b, src.layerOff(m.Layer)+m.SrcOff); err != nil {
			t.Fatal(err)
		}
		if err := dst.mem.WriteAt(b, dst.layerOff(m.Layer)+m.DstOff); err != nil {
			t.Fatal(err)
		}
	}
}

func TestVerify(t *testing.T) {
	const layers, lb, guard, block = 3, 64 << 10, 4096, 4096
	for _, tc := range []struct {
		name  string
		moves func(c *Cache) []Move
		spoil func(t *testing.T, dst *Cache, ms []Move) // after the copy
		want  string                                    // "" for no error
	}{
		{"ranges intact", func(c *Cache) []Move { return Ranges(c, 16<<10) }, nil, ""},
		{"blocks intact", func(c *Cache) []Move { return Blocks(c, block, 3) }, nil, ""},
		{"a byte changed", func(c *Cache) []Move { return Blocks(c, block, 3) }, func(t *testing.T, dst *Cache, ms []Move) {
			m := ms[len(ms)/2]
			b := []byte{0}
			if err := dst.mem.ReadAt(b, dst.layerOff(m.Layer)+m.DstOff+100); err != nil {
				t.Fatal(err)
			}
			b[0] ^= 0xFF
			if err := dst.mem.WriteAt(b, dst.layerOff(m.Layer)+m.DstOff+100); err != nil {
				t.Fatal(err)
			}
		}, "first difference at byte 100"},
		{"guard overwritten", func(c *Cache) []Move { return Ranges(c, lb) }, func(t *testing.T, dst *Cache, _ []Move) {
			if err := dst.mem.WriteAt([]byte{1}, dst.Guard-1); err != nil {
				t.Fatal(err)
			}
		}, "guard bytes"},
		{"a move missing", func(c *Cache) []Move { return Ranges(c, 16<<10) }, func(t *testing.T, dst *Cache, ms []Move) {
			m := ms[0]
			if err := dst.mem.WriteAt(make([]byte, m.Len), dst.layerOff(m.Layer)+m.DstOff); err != nil {
				t.Fatal(err)
			}
		}, "move 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := pair(t, layers, lb, guard)
			ms := tc.moves(src)
			copyMoves(t, src, dst, ms)
			if tc.spoil != nil {
				tc.spoil(t, dst, ms)
			}
			// Twice: the second call runs on the buffers the first kept.
			for i := 0; i < 2; i++ {
				err := Verify(src, dst, ms, 0xAB)
				switch {
				case tc.want == "" && err != nil:
					t.Fatalf("call %d: %v", i, err)
				case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
					t.Fatalf("call %d: got %v, want an error with %q", i, err, tc.want)
				}
			}
		})
	}
}

// A bench that checks after every transfer must not allocate a layer each
// time: the garbage collections that caused put the check into the
// transfers' p99 (docs/BENCHMARKS.md, issue 37 item 4).
func TestVerifyPoisonKeepBuffers(t *testing.T) {
	const lb = 1 << 20
	src, dst := pair(t, 2, lb, 4096)
	ms := Ranges(src, lb)
	copyMoves(t, src, dst, ms)
	if err := Verify(src, dst, ms, 0xAB); err != nil {
		t.Fatal(err)
	}
	var verr error
	allocs := testing.AllocsPerRun(20, func() {
		if err := dst.Poison(0xAB); err != nil {
			verr = err
		}
		copyMoves(t, src, dst, nil)
		if err := Verify(src, dst, nil, 0xAB); err != nil {
			verr = err
		}
	})
	if verr != nil {
		t.Fatal(verr)
	}
	if allocs > 8 {
		t.Errorf("Poison and Verify allocate %.0f times a call, want a few (their buffers kept)", allocs)
	}
	// And a layer's worth of bytes is not among them.
	copyMoves(t, src, dst, ms) // the runs above poisoned it
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < 10; i++ {
		if err := Verify(src, dst, ms, 0xAB); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > lb {
		t.Errorf("10 checks of 2 x 1 MiB layers allocated %d B; want the kept buffers reused", grew)
	}
}

// Verify with one cache on both sides compares it with itself.
func TestVerifySameCache(t *testing.T) {
	src, _ := pair(t, 1, 8192, 0)
	ms := []Move{{Layer: 0, SrcOff: 0, DstOff: 0, Len: 8192}}
	if err := Verify(src, src, ms, 0xAB); err != nil {
		t.Fatal(err)
	}
}
