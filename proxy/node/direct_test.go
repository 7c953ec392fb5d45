package node

import (
	"bytes"
	"testing"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/hostmem"
)

// TestSplitPieces: a large direct copy is cut into runs of about equal
// bytes, in order, every byte in exactly one run at its own addresses;
// small copies and one stream stay whole.
func TestSplitPieces(t *testing.T) {
	const mib = 1 << 20
	p := func(dst, src device.Addr, n uint64) piece { return piece{dst: dst, src: src, n: n} }
	for _, tc := range []struct {
		name    string
		ps      []piece
		n       int
		want    []uint64 // bytes of each run
		wantCut int      // pieces across all runs
	}{
		{"one stream", []piece{p(0, 1<<40, 256*mib)}, 1, []uint64{256 * mib}, 1},
		{"zero streams (options unset)", []piece{p(0, 1<<40, 256*mib)}, 0, []uint64{256 * mib}, 1},
		{"below splitMin", []piece{p(0, 1<<40, splitMin-1)}, 4, []uint64{splitMin - 1}, 1},
		{"one piece, two streams", []piece{p(0, 1<<40, 4096*mib)}, 2, []uint64{2048 * mib, 2048 * mib}, 2},
		{"odd bytes, two streams", []piece{p(0, 1<<40, 128*mib+1)}, 2, []uint64{64*mib + 1, 64 * mib}, 2},
		{"pieces cut at the share", []piece{p(0, 1<<40, 100*mib), p(1<<30, 1<<41, 20*mib)}, 2, []uint64{60 * mib, 60 * mib}, 3},
		{"four streams over three pieces", []piece{p(0, 1<<40, 30*mib), p(1<<30, 1<<41, 30*mib), p(1<<31, 1<<42, 60*mib)}, 4, []uint64{30 * mib, 30 * mib, 30 * mib, 30 * mib}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := splitPieces(tc.ps, tc.n)
			if len(runs) != len(tc.want) {
				t.Fatalf("%d runs, want %d: %v", len(runs), len(tc.want), runs)
			}
			var flat []piece
			for i, run := range runs {
				var b uint64
				for _, q := range run {
					if q.n == 0 {
						t.Fatalf("run %d holds an empty piece", i)
					}
					b += q.n
				}
				if b != tc.want[i] {
					t.Errorf("run %d moves %d B, want %d", i, b, tc.want[i])
				}
				flat = append(flat, run...)
			}
			if len(flat) != tc.wantCut {
				t.Errorf("%d pieces in all, want %d", len(flat), tc.wantCut)
			}
			// Merged back, the runs are the copies asked for, in order.
			var merged []piece
			for _, q := range flat {
				merged = appendPiece(merged, q)
			}
			if len(merged) != len(tc.ps) {
				t.Fatalf("merged back to %d pieces, want %d: %v", len(merged), len(tc.ps), merged)
			}
			for i := range merged {
				if merged[i] != tc.ps[i] {
					t.Errorf("piece %d merged back to %+v, want %+v", i, merged[i], tc.ps[i])
				}
			}
		})
	}
}

// TestCopyDirectStreams: copyDirect moves every byte of a copy it splits
// across streams, and of one it keeps whole (hostmem's streams copy).
func TestCopyDirectStreams(t *testing.T) {
	dv, err := hostmem.Open(0, device.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := dv.Close(); err != nil {
			t.Errorf("device close: %v", err)
		}
	}()
	const n = splitMin + 3<<20 + 5 // not a multiple of the stream count
	src, err := dv.AllocPinned(n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dv.FreePinned(src) }()
	dst, err := dv.AllocPinned(n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dv.FreePinned(dst) }()
	for i := range src.Host() {
		src.Host()[i] = byte(i*7 + i>>16)
	}
	for _, streams := range []int{1, 3} {
		clear(dst.Host())
		r := &Room{o: Options{Dev: dv, CopyStreams: streams}}
		// two pieces: the first half, and the rest at the other end's front (swapped halves)
		h := uint64(n / 2)
		ps := []piece{
			{dst: dst.DeviceAddr() + device.Addr(n-h), src: src.DeviceAddr(), n: h},
			{dst: dst.DeviceAddr(), src: src.DeviceAddr() + device.Addr(h), n: n - h},
		}
		if _, err := r.copyDirect(ps, nil); err != nil {
			t.Fatalf("%d streams: %v", streams, err)
		}
		if !bytes.Equal(dst.Host()[n-h:], src.Host()[:h]) || !bytes.Equal(dst.Host()[:n-h], src.Host()[h:]) {
			t.Fatalf("%d streams: the destination differs from the copies asked for", streams)
		}
	}
}
