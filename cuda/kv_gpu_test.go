//go:build gpu

package cuda

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/kvlayout"
)

// kvBench is one layer of a KV cache in device memory and the side of a
// transfer over it: 8 kv heads of 128 bf16, 4096 tokens in a random block
// table, against a peer whose parts are K and V (columns 128 and 128).
type kvBench struct {
	d       *Device
	base    device.Addr
	lens    []uint64
	offs    []uint64
	side    *kvlayout.Side
	cleanup func()
}

func newKVBench(tb testing.TB, preset string, bs uint32, cfg Config) *kvBench {
	d := openGPUConfig(tb, cfg)
	const tokens = 4096
	blocks := uint32(2 * tokens / bs)
	p := kvlayout.Params{DType: kvlayout.BF16, Blocks: blocks, BlockSize: bs, Heads: 8, HeadHi: 8, HeadSize: 128}
	l, lens, err := kvlayout.Preset(preset, p)
	if err != nil {
		tb.Fatal(err)
	}
	peer, _, err := kvlayout.Preset("ascend", kvlayout.Params{DType: kvlayout.BF16, Blocks: 64, BlockSize: 128, Heads: 8, HeadHi: 8, HeadSize: 128})
	if err != nil {
		tb.Fatal(err)
	}
	var size uint64
	offs := make([]uint64, len(lens))
	regions := []int{}
	for i, n := range lens {
		offs[i] = size
		size += (n + 4095) &^ 4095
		regions = append(regions, i)
	}
	base, err := d.AllocDevice(size)
	if err != nil {
		tb.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	table := make([]uint32, tokens/bs)
	for i, id := range rng.Perm(int(blocks))[:len(table)] {
		table[i] = uint32(id)
	}
	side, err := kvlayout.NewSide(kvlayout.SideSpec{Layout: l, Regions: [][]int{regions}, Table: table, Tokens: tokens,
		HeadLo: 0, HeadHi: 8, Cols: kvlayout.Columns(l, peer)})
	if err != nil {
		tb.Fatal(err)
	}
	return &kvBench{d: d, base: base, lens: lens, offs: offs, side: side, cleanup: func() { _ = d.FreeDevice(base) }}
}

// segs appends the device segments of canonical bytes [off, off+n).
func (k *kvBench) segs(off, n uint64, segs []device.Seg) []device.Seg {
	k.side.Segments(off, n, func(_, t int, toff uint64, length uint32, _ uint64) {
		segs = append(segs, device.Seg{Addr: k.base + device.Addr(k.offs[t]+toff), Len: uint64(length)})
	})
	return segs
}

// kvOpts vary benchKV: premapped maps every chunk's segments before the
// timer (the backend alone, without kvlayout's walk), plain takes the
// strided kernel away (one descriptor per segment, as before it), and
// maxBytes, when set, caps a strided descriptor.
type kvOpts struct {
	premapped, plain bool
	maxBytes         uint64
}

// benchKV gathers (or scatters) the transfer's canonical stream in 4 MiB
// chunks between the layout and one pinned slot, mapping each chunk's
// segments in the loop as the sidecar does.
func benchKV(b *testing.B, preset string, bs uint32, gather bool) {
	benchKVOpts(b, preset, bs, gather, kvOpts{})
}

func benchKVOpts(b *testing.B, preset string, bs uint32, gather bool, o kvOpts) {
	k := newKVBench(b, preset, bs, Config{StridedMaxBytes: o.maxBytes})
	defer k.cleanup()
	if o.plain {
		k.d.fnStrided = nil
	}
	s, p := slotStream(b, k.d)
	total := k.side.Len()
	chunks := int(total / benchSlot)
	var segs []device.Seg
	lists := make([][]device.Seg, chunks)
	if o.premapped {
		for i := range lists {
			lists[i] = k.segs(uint64(i)*benchSlot, benchSlot, nil)
		}
	}
	var mapT, hostT time.Duration // kvlayout's walk; Gather or Scatter (host work, or a full ring's wait)
	op := func(i int) error {
		t0 := time.Now()
		if o.premapped {
			segs = lists[i%chunks]
		} else {
			segs = k.segs(uint64(i%chunks)*benchSlot, benchSlot, segs[:0])
		}
		t1 := time.Now()
		defer func() { mapT, hostT = mapT+t1.Sub(t0), hostT+time.Since(t1) }()
		if gather {
			return s.Gather(p, segs)
		}
		return s.Scatter(segs, p)
	}
	for i := range chunks {
		if err := op(i); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
	launches := s.stridedLaunches
	mapT, hostT = 0, 0
	b.ReportMetric(float64(len(segs)), "segs/chunk")
	b.SetBytes(benchSlot)
	b.ResetTimer()
	for i := range b.N {
		if err := op(i); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(s.stridedLaunches-launches)/float64(b.N), "strided-launches/chunk")
	b.ReportMetric(float64(mapT.Microseconds())/float64(b.N), "map-us/chunk")
	b.ReportMetric(float64(hostT.Microseconds())/float64(b.N), "call-us/chunk")
}

// slotStream opens a stream and a pinned slot of benchSlot bytes, both
// released when b ends.
func slotStream(b *testing.B, d *Device) (*Stream, device.Pinned) {
	p, err := d.AllocPinned(benchSlot)
	if err != nil {
		b.Fatal(err)
	}
	s, err := d.NewCUDAStream()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		s.Close()
		d.FreePinned(p)
	})
	return s, p
}

// benchKVParallel is benchKV from workers goroutines, each with its own
// stream and pinned slot, as the sidecar's stripes run: the GPU's figure
// once the host's per-chunk work is spread over cores.
func benchKVParallel(b *testing.B, gather bool, workers int, o kvOpts) {
	k := newKVBench(b, "vllm-hnd", 16, Config{})
	defer k.cleanup()
	if o.plain {
		k.d.fnStrided = nil
	}
	chunks := int(k.side.Len() / benchSlot)
	lists := make([][]device.Seg, chunks)
	for i := range lists {
		lists[i] = k.segs(uint64(i)*benchSlot, benchSlot, nil)
	}
	type worker struct {
		s    *Stream
		p    device.Pinned
		segs []device.Seg
	}
	ws := make([]*worker, workers)
	for i := range ws {
		s, p := slotStream(b, k.d)
		ws[i] = &worker{s: s, p: p}
	}
	run := func(w *worker, from, to int) error {
		for i := from; i < to; i++ {
			if o.premapped {
				w.segs = lists[i%chunks]
			} else {
				w.segs = k.segs(uint64(i%chunks)*benchSlot, benchSlot, w.segs[:0])
			}
			var err error
			if gather {
				err = w.s.Gather(w.p, w.segs)
			} else {
				err = w.s.Scatter(w.segs, w.p)
			}
			if err != nil {
				return err
			}
		}
		return w.s.Synchronize()
	}
	for _, w := range ws {
		if err := run(w, 0, chunks); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(benchSlot)
	b.ResetTimer()
	errs := make(chan error, workers)
	for i, w := range ws {
		go func() { errs <- run(w, i*b.N/workers, (i+1)*b.N/workers) }()
	}
	for range ws {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGPUKVHNDParallel(b *testing.B) {
	for _, dir := range []string{"gather", "scatter"} {
		g := dir == "gather"
		b.Run(dir+"/4", func(b *testing.B) { benchKVParallel(b, g, 4, kvOpts{}) })
		b.Run(dir+"/4-premapped", func(b *testing.B) { benchKVParallel(b, g, 4, kvOpts{premapped: true}) })
		b.Run(dir+"/8-premapped", func(b *testing.B) { benchKVParallel(b, g, 8, kvOpts{premapped: true}) })
		b.Run(dir+"/4-premapped-plain", func(b *testing.B) { benchKVParallel(b, g, 4, kvOpts{premapped: true, plain: true}) })
	}
}

// The conversion alone: an HND layout of block 16 (256-byte rows apart)
// and an Ascend layout of block 128 (contiguous per block), to and from
// a pinned slot; BenchmarkGPUD2H4MiB is the ceiling to compare with.
func BenchmarkGPUKVGatherHND(b *testing.B)    { benchKV(b, "vllm-hnd", 16, true) }
func BenchmarkGPUKVScatterHND(b *testing.B)   { benchKV(b, "vllm-hnd", 16, false) }
func BenchmarkGPUKVGatherAscend(b *testing.B) { benchKV(b, "ascend", 128, true) }
func BenchmarkGPUKVScatterAscend(b *testing.B) {
	benchKV(b, "ascend", 128, false)
}

// BenchmarkGPUKVHND splits the HND figures: segments mapped beforehand
// (the backend alone), the plain kernel (no strided descriptors), and
// strided descriptor caps.
func BenchmarkGPUKVHND(b *testing.B) {
	variants := []struct {
		name string
		o    kvOpts
	}{
		{"premapped", kvOpts{premapped: true}},
		{"premapped-plain", kvOpts{premapped: true, plain: true}},
		{"premapped-cap8K", kvOpts{premapped: true, maxBytes: 8 << 10}},
		{"premapped-cap16K", kvOpts{premapped: true, maxBytes: 16 << 10}},
		{"premapped-cap64K", kvOpts{premapped: true, maxBytes: 64 << 10}},
	}
	for _, dir := range []string{"gather", "scatter"} {
		for _, v := range variants {
			b.Run(dir+"/"+v.name, func(b *testing.B) { benchKVOpts(b, "vllm-hnd", 16, dir == "gather", v.o) })
		}
	}
}

// TestGPUKVRoundTrip: the canonical stream gathered from one layout on
// the device and scattered into another equals kvlayout's reference
// copier's, row for row, on the real driver.
func TestGPUKVRoundTrip(t *testing.T) {
	k := newKVBench(t, "vllm-hnd", 16, Config{})
	defer k.cleanup()
	var size uint64
	for i, n := range k.lens {
		size = max(size, k.offs[i]+n)
	}
	img := make([]byte, size)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range img {
		img[i] = byte(rng.Uint32())
	}
	if err := k.d.CopyHtoD(k.base, img); err != nil {
		t.Fatal(err)
	}
	p, err := k.d.AllocPinned(benchSlot)
	if err != nil {
		t.Fatal(err)
	}
	defer k.d.FreePinned(p)
	s, err := k.d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tensors := make([][]byte, len(k.lens))
	for i, n := range k.lens {
		tensors[i] = img[k.offs[i] : k.offs[i]+n]
	}
	want := make([]byte, benchSlot)
	for off := uint64(0); off < k.side.Len(); off += benchSlot {
		if err := s.Gather(p, k.segs(off, benchSlot, nil)); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if err := kvlayout.Gather(k.side, tensors, off, want); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(p.Host(), want) {
			t.Fatalf("chunk at %d: the device gather differs from the reference", off)
		}
	}
}
