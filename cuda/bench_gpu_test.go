//go:build gpu

package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/devicetest"
)

const (
	benchSlot   = 4 << 20
	benchBlock  = 16 << 10
	benchBlocks = benchSlot / benchBlock // 256
	benchPool   = 1 << 30
)

// benchMove gathers (or scatters) 256 scattered 16 KiB blocks of a 1 GiB
// pool into (from) one 4 MiB pinned slot per iteration, all on one stream,
// rotating through 16 random block lists.
func benchMove(b *testing.B, mode CopyMode, gather bool) {
	d := openGPU(b, mode)
	pool, err := d.AllocDevice(benchPool)
	if err != nil {
		b.Fatal(err)
	}
	defer d.FreeDevice(pool)
	p, err := d.AllocPinned(benchSlot)
	if err != nil {
		b.Fatal(err)
	}
	defer d.FreePinned(p)
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	lists := make([][]device.Seg, 16)
	for i := range lists {
		lists[i] = devicetest.BlockSegs(rng, pool, benchPool, benchBlocks, benchBlock)
	}
	op := func(segs []device.Seg) error {
		if gather {
			return s.Gather(p, segs)
		}
		return s.Scatter(segs, p)
	}
	for _, l := range lists { // warm up (kernel JIT, ring slots, page tables)
		if err := op(l); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchSlot)
	b.ResetTimer()
	for i := range b.N {
		if err := op(lists[i%len(lists)]); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkGPUGather256x16KiB(b *testing.B) {
	for _, m := range copyModes {
		b.Run(string(m), func(b *testing.B) { benchMove(b, m, true) })
	}
}

func BenchmarkGPUScatter256x16KiB(b *testing.B) {
	for _, m := range copyModes {
		b.Run(string(m), func(b *testing.B) { benchMove(b, m, false) })
	}
}

// benchSingle moves one contiguous 4 MiB range per iteration (one plain
// cuMemcpy*Async).
func benchSingle(b *testing.B, gather bool) {
	d := openGPU(b, CopyAuto)
	pool, err := d.AllocDevice(benchSlot)
	if err != nil {
		b.Fatal(err)
	}
	defer d.FreeDevice(pool)
	p, err := d.AllocPinned(benchSlot)
	if err != nil {
		b.Fatal(err)
	}
	defer d.FreePinned(p)
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	segs := []device.Seg{{Addr: pool, Len: benchSlot}}
	b.SetBytes(benchSlot)
	b.ResetTimer()
	for range b.N {
		var err error
		if gather {
			err = s.Gather(p, segs)
		} else {
			err = s.Scatter(segs, p)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkGPUD2H4MiB(b *testing.B) { benchSingle(b, true) }
func BenchmarkGPUH2D4MiB(b *testing.B) { benchSingle(b, false) }

// BenchmarkGPUEventQuery is the cost of one bound call on the hot path:
// cgo crossing + context check + cuEventQuery of a completed event.
func BenchmarkGPUEventQuery(b *testing.B) {
	d := openGPU(b, CopyAuto)
	ev, err := d.NewEvent()
	if err != nil {
		b.Fatal(err)
	}
	defer ev.Close()
	b.ResetTimer()
	for range b.N {
		if done, err := ev.Query(); !done || err != nil {
			b.Fatal(done, err)
		}
	}
}

// BenchmarkGPUCallOverhead is one cgo crossing into a trivial driver call
// (cuDriverGetVersion), for comparison with BenchmarkGPUEventQuery.
func BenchmarkGPUCallOverhead(b *testing.B) {
	l := gpuLibrary(b)
	for range b.N {
		if _, err := l.DriverVersion(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGPUGatherLatency is one 256 x 16 KiB kernel gather followed by
// a wait on its event: the per-chunk latency a pipeline sees, not its
// throughput.
func BenchmarkGPUGatherLatency(b *testing.B) {
	d := openGPU(b, CopyKernel)
	pool, err := d.AllocDevice(benchPool)
	if err != nil {
		b.Fatal(err)
	}
	defer d.FreeDevice(pool)
	p, err := d.AllocPinned(benchSlot)
	if err != nil {
		b.Fatal(err)
	}
	defer d.FreePinned(p)
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ev, err := d.NewEvent()
	if err != nil {
		b.Fatal(err)
	}
	defer ev.Close()
	segs := devicetest.BlockSegs(rand.New(rand.NewPCG(3, 4)), pool, benchPool, benchBlocks, benchBlock)
	b.SetBytes(benchSlot)
	b.ResetTimer()
	for range b.N {
		if err := s.Gather(p, segs); err != nil {
			b.Fatal(err)
		}
		if err := s.Record(ev); err != nil {
			b.Fatal(err)
		}
		if err := ev.Wait(); err != nil {
			b.Fatal(err)
		}
	}
}
