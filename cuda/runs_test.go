package cuda

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/devicetest"
)

// runCase is a run list inside a pool of 8 MiB or more, whose runs do not
// overlap, and whether it must take the strided kernel.
type runCase struct {
	name    string
	runs    []device.Run
	strided bool
}

// hndRuns is one run per block of nb random HND blocks (bs tokens, heads
// heads, pieces of piece bytes, head-major) in [base, base+size-64 KiB),
// each block off bytes past a multiple of its size.
func hndRuns(rng *rand.Rand, base device.Addr, size, nb, bs, heads, piece, off uint64) []device.Run {
	blockBytes := heads * bs * piece
	perm := rng.Perm(int((size - 64<<10 - off) / blockBytes))
	runs := make([]device.Run, 0, nb)
	for _, b := range perm[:nb] {
		runs = append(runs, device.Run{Addr: base + device.Addr(off+uint64(b)*blockBytes), Len: uint32(piece),
			N1: uint32(heads), S1: bs * piece, N2: uint32(bs), S2: piece})
	}
	return runs
}

func runCases(rng *rand.Rand, pool device.Addr, size uint64) []runCase {
	tail := pool + device.Addr(size-64<<10) // the last 64 KiB: the cut pieces
	cut := append([]device.Run{{Addr: tail + 7, Len: 100, N1: 1, N2: 1}}, hndRuns(rng, pool, size, 9, 16, 8, 256, 0)...)
	cut = append(cut, device.Run{Addr: tail + 4096, Len: 1024, N1: 3, S1: 2048, N2: 1}, device.Run{Addr: tail + 20000, Len: 33, N1: 1, N2: 1})
	blocks := devicetest.BlockSegs(rng, pool, size, 64, 16<<10)
	whole := make([]device.Run, len(blocks))
	for i, b := range blocks {
		whole[i] = device.Run{Addr: b.Addr, Len: uint32(b.Len), N1: 1, N2: 1}
	}
	return []runCase{
		{"hnd", hndRuns(rng, pool, size, 40, 16, 8, 256, 0), true},
		{"hnd-odd", hndRuns(rng, pool, size, 7, 32, 5, 17, 3), true},
		{"hnd-cut", cut, true},
		{"rows-over-max", []device.Run{{Addr: pool, Len: 4096, N1: 4, S1: 8192, N2: 64, S2: 64 << 10}}, true},
		{"row-over-max", []device.Run{{Addr: pool + 5, Len: 1024, N1: 100, S1: 2048, N2: 3, S2: 300000}}, true},
		{"piece-over-max", []device.Run{{Addr: pool + 1, Len: 100000, N1: 2, S1: 200000, N2: 2, S2: 450000}}, true},
		{"whole-blocks", whole, false},
	}
}

// mergeSegs joins segments that continue each other.
func mergeSegs(segs []device.Seg) []device.Seg {
	var out []device.Seg
	for _, s := range segs {
		if k := len(out) - 1; k >= 0 && out[k].Addr+device.Addr(out[k].Len) == s.Addr {
			out[k].Len += s.Len
			continue
		}
		out = append(out, s)
	}
	return out
}

// TestRunDescriptors: the descriptors cut from every run case, gather and
// scatter, hold at most DefaultStridedMaxBytes each, have their slot side
// contiguous, and cover the runs' pieces in order.
func TestRunDescriptors(t *testing.T) {
	const size = 8 << 20
	for _, tc := range runCases(rand.New(rand.NewPCG(5, 6)), 1<<40, size) {
		for _, gather := range []bool{true, false} {
			var ds []sdesc
			slot := uint64(1 << 50)
			pinned := slot
			for i := range tc.runs {
				var cur runCursor
				for last := false; !last; {
					var d sdesc
					d, last = cur.next(&tc.runs[i], pinned, gather, DefaultStridedMaxBytes)
					if b := uint64(d.len) * uint64(d.n1) * uint64(d.n2); b > DefaultStridedMaxBytes {
						t.Fatalf("%s: descriptor %+v holds %d B, above %d", tc.name, d, b, DefaultStridedMaxBytes)
					}
					pinned += uint64(d.len) * uint64(d.n1) * uint64(d.n2)
					ds = append(ds, d)
				}
			}
			got := mergeSegs(expand(t, ds, gather, &slot))
			want := mergeSegs(device.AppendRunSegs(nil, tc.runs))
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s (gather %v): descriptors cover %d ranges, the runs %d", tc.name, gather, len(got), len(want))
			}
		}
	}
}

// TestFakeRuns: with the strided kernel, run lists gather and scatter
// byte-exact through it; runs of one piece each, and a module without the
// kernel, take the segment path and move the same bytes; bad runs are
// refused before anything is enqueued.
func TestFakeRuns(t *testing.T) {
	l := fakeLibrary(t)
	d := openFake(t, l, Config{CopyMode: CopyKernel, PTX: fakeStridedPTX})
	const poolSize = 8 << 20
	pool, data := devicetest.Pool(t, d, poolSize, 61)
	launches := func() int64 { n, _ := l.Call("fake_strided_launches"); return int64(n) }
	plain := openFake(t, l, Config{CopyMode: CopyKernel, PTX: fakePTX})
	for i, tc := range runCases(rand.New(rand.NewPCG(62, 63)), pool, poolSize) {
		t.Run(tc.name, func(t *testing.T) {
			before := launches()
			devicetest.CheckRuns(t, d, d, pool, data, tc.runs, uint64(70+i))
			if got := launches() > before; got != tc.strided {
				t.Errorf("strided kernel launched: %v, want %v", got, tc.strided)
			}
			before = launches()
			devicetest.CheckRuns(t, plain, plain, pool, data, tc.runs, uint64(80+i))
			if launches() != before {
				t.Error("a module without the strided kernel launched it")
			}
		})
	}

	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := d.AllocPinned(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreePinned(p)
	rc := s.(device.RunCopier)
	for _, bad := range []struct {
		name string
		runs []device.Run
		want string
	}{
		{"empty piece", []device.Run{{Addr: pool, Len: 0, N1: 1, N2: 1}}, "empty"},
		{"no rows", []device.Run{{Addr: pool, Len: 4096, N1: 1, N2: 0}}, "empty"},
		{"extent past 2^64", []device.Run{{Addr: pool, Len: 1024, N1: 2, S1: 1 << 63, N2: 2, S2: 1 << 63}}, "overflows"},
		{"bytes past 2^64", []device.Run{{Addr: pool, Len: 1 << 31, N1: 1 << 31, N2: 1 << 31}}, "overflows"},
		{"short", []device.Run{{Addr: pool, Len: 1024, N1: 2, S1: 4096, N2: 1}}, "add up to 2048"},
	} {
		if err := rc.GatherRuns(p, bad.runs); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: GatherRuns = %v, want an error saying %q", bad.name, err, bad.want)
		}
		if err := rc.ScatterRuns(bad.runs, p); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: ScatterRuns = %v, want an error saying %q", bad.name, err, bad.want)
		}
	}
}
