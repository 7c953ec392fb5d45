package hostmem

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stage-kv/stage/device"
)

func TestGatherScatterRoundTrip(t *testing.T) {
	const regionSize = 16 << 20
	lens := func(n int, lo, hi uint64) func(*rand.Rand) []uint64 {
		return func(rng *rand.Rand) []uint64 {
			l := make([]uint64, n)
			for i := range l {
				l[i] = lo + rng.Uint64N(hi-lo+1)
			}
			return l
		}
	}
	tests := []struct {
		name string
		lens func(*rand.Rand) []uint64
	}{
		{"one byte", lens(1, 1, 1)},
		{"one big seg", lens(1, 4<<20, 4<<20)},
		{"many small segs", lens(4096, 1, 64)},
		{"KV blocks", lens(256, 16<<10, 16<<10)},
		{"mixed sizes", lens(100, 1, 64<<10)},
		{"many small and one big", func(rng *rand.Rand) []uint64 {
			l := lens(1000, 1, 256)(rng)
			l = append(l, 2<<20)
			rng.Shuffle(len(l), func(i, j int) { l[i], l[j] = l[j], l[i] })
			return l
		}},
	}
	d := newDev(t, Config{})
	src, srcMap := newSharedT(t, d, regionSize)
	dst, dstMap := newSharedT(t, d, regionSize)
	slab := allocPinnedT(t, d, 8<<20)
	s := newStreamT(t, d)
	ev := newEventT(t, d)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := newRand(t)
			fillRandom(rng, src.Bytes())
			clear(dst.Bytes())
			l := tc.lens(rng)
			gsegs, goffs := layout(rng, srcMap.Base(), srcMap.Size(), l)
			ssegs, soffs := layout(rng, dstMap.Base(), dstMap.Size(), l)
			total := int(device.SegsLen(gsegs))
			off := rng.IntN(slab.Len() - total + 1)
			p := slab.Slice(off, total)

			if err := s.Gather(p, gsegs); err != nil {
				t.Fatalf("Gather: %v", err)
			}
			if err := s.Record(ev); err != nil {
				t.Fatalf("Record: %v", err)
			}
			if err := ev.Wait(); err != nil {
				t.Fatalf("Wait after gather: %v", err)
			}
			var want []byte
			for i, sg := range gsegs {
				want = append(want, src.Bytes()[goffs[i]:goffs[i]+sg.Len]...)
			}
			if !bytes.Equal(p.Host(), want) {
				t.Fatalf("gathered bytes differ from the segments' bytes (first difference at %d of %d)", firstDiff(p.Host(), want), total)
			}

			if err := s.Scatter(ssegs, p); err != nil {
				t.Fatalf("Scatter: %v", err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatalf("Synchronize after scatter: %v", err)
			}
			// Read back through the engine's mapping, not the imported one.
			var at uint64
			for i, sg := range ssegs {
				got := dst.Bytes()[soffs[i] : soffs[i]+sg.Len]
				if !bytes.Equal(got, want[at:at+sg.Len]) {
					t.Fatalf("segment %d of %d (%d B at offset %d): scattered bytes differ", i, len(ssegs), sg.Len, soffs[i])
				}
				at += sg.Len
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// The caller may reuse its segment slice as soon as Gather returns.
func TestGatherCopiesSegs(t *testing.T) {
	d := newDev(t, Config{Latency: 20 * time.Millisecond})
	src, m := newSharedT(t, d, 1<<16)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i)
	}
	p := allocPinnedT(t, d, 4)
	s := newStreamT(t, d)
	segs := []device.Seg{sg(m.Base()+10, 2), sg(m.Base()+20, 2)}
	if err := s.Gather(p, segs); err != nil {
		t.Fatalf("Gather: %v", err)
	}
	// The worker is still waiting out the latency of the first copy, or has
	// not started it: either way this must not change what it copies.
	segs[0].Addr, segs[1].Addr = m.Base()+100, m.Base()+200
	if err := s.Synchronize(); err != nil {
		t.Fatalf("Synchronize: %v", err)
	}
	if got, want := p.Host(), []byte{10, 11, 20, 21}; !bytes.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestEnqueueRejects(t *testing.T) {
	d := newDev(t, Config{})
	_, m := newSharedT(t, d, 1<<16)
	p := allocPinnedT(t, d, 4096)
	base := m.Base()
	tests := []struct {
		name string
		p    device.Pinned
		segs []device.Seg
		want string
	}{
		{"sum short", p, []device.Seg{sg(base, 1000), sg(base+2000, 1000)}, "add up to 2000 B, pinned buffer is 4096 B"},
		{"sum long", p.Slice(0, 100), []device.Seg{sg(base, 64), sg(base+100, 64)}, "add up to 128 B, pinned buffer is 100 B"},
		{"only empty segs", p.Slice(0, 8), []device.Seg{sg(base, 0), sg(0, 0)}, "add up to 0 B, pinned buffer is 8 B"},
		{"no segs", p.Slice(0, 8), nil, "nothing to copy"},
		{"empty pinned", p.Slice(0, 0), []device.Seg{sg(base, 8)}, "nothing to copy"},
		{"address 0", p.Slice(0, 8), []device.Seg{sg(0, 8)}, "at address 0"},
		{"seg wraps", p.Slice(0, 16), []device.Seg{sg(math.MaxUint64-7, 16)}, "wraps around"},
		{"lengths overflow", p.Slice(0, 16), []device.Seg{sg(base, 8), sg(1, math.MaxUint64-1)}, "overflow"},
		{"not pinned", device.NewPinned(make([]byte, 8), 0), []device.Seg{sg(base, 8)}, "device view"},
	}
	s := newStreamT(t, d)
	st := s.(*stream)
	for _, tc := range tests {
		for _, dir := range []string{"gather", "scatter"} {
			t.Run(tc.name+"/"+dir, func(t *testing.T) {
				var err error
				if dir == "gather" {
					err = s.Gather(tc.p, tc.segs)
				} else {
					err = s.Scatter(tc.segs, tc.p)
				}
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got error %v, want one containing %q", err, tc.want)
				}
				if got := st.submitted.Load(); got != 0 {
					t.Errorf("ops enqueued: got %d, want 0", got)
				}
			})
		}
	}
	if err := s.Synchronize(); err != nil {
		t.Fatalf("Synchronize: %v", err)
	}
	if got := d.Stats().Copies; got != 0 {
		t.Errorf("copies run: got %d, want 0", got)
	}
}

func TestEvents(t *testing.T) {
	const lat = 100 * time.Millisecond
	d := newDev(t, Config{Latency: lat})
	_, m := newSharedT(t, d, 4096)
	p := allocPinnedT(t, d, 64)
	s := newStreamT(t, d)
	ev := newEventT(t, d)
	segs := []device.Seg{sg(m.Base(), 64)}

	if done, err := ev.Query(); !done || err != nil {
		t.Fatalf("Query of a never-recorded event: got (%v, %v), want (true, nil)", done, err)
	}
	if err := ev.Wait(); err != nil {
		t.Fatalf("Wait of a never-recorded event: got %v, want nil", err)
	}
	for round := range 2 { // the second round re-records the completed event
		if err := s.Gather(p, segs); err != nil {
			t.Fatalf("round %d: Gather: %v", round, err)
		}
		if err := s.Record(ev); err != nil {
			t.Fatalf("round %d: Record: got %v, want nil", round, err)
		}
		if done, err := ev.Query(); done || err != nil {
			t.Fatalf("round %d: Query right after Record (copy takes %v): got (%v, %v), want (false, nil)", round, lat, done, err)
		}
		if err := s.Record(ev); !errors.Is(err, device.ErrNotReady) {
			t.Fatalf("round %d: Record of a pending event: got %v, want ErrNotReady", round, err)
		}
		if err := ev.Wait(); err != nil {
			t.Fatalf("round %d: Wait: got %v, want nil", round, err)
		}
		if done, err := ev.Query(); !done || err != nil {
			t.Fatalf("round %d: Query after Wait: got (%v, %v), want (true, nil)", round, done, err)
		}
	}
	if got, want := ev.(*event).gen, uint64(2); got != want {
		t.Errorf("generations: got %d, want %d", got, want)
	}

	t.Run("waiters on several goroutines", func(t *testing.T) {
		if err := s.Gather(p, segs); err != nil {
			t.Fatalf("Gather: %v", err)
		}
		if err := s.Record(ev); err != nil {
			t.Fatalf("Record: %v", err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() { errs[i] = ev.Wait() })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("waiter %d: got %v, want nil", i, err)
			}
		}
	})

	t.Run("event of another device", func(t *testing.T) {
		other := newDev(t, Config{})
		oev := newEventT(t, other)
		if err := s.Record(oev); !errors.Is(err, device.ErrBadHandle) {
			t.Errorf("got %v, want ErrBadHandle", err)
		}
	})

	t.Run("closed event", func(t *testing.T) {
		e2, err := d.NewEvent()
		if err != nil {
			t.Fatal(err)
		}
		if err := e2.Close(); err != nil {
			t.Fatalf("Close: got %v, want nil", err)
		}
		if err := e2.Close(); !errors.Is(err, device.ErrClosed) {
			t.Errorf("second Close: got %v, want ErrClosed", err)
		}
		if err := s.Record(e2); !errors.Is(err, device.ErrClosed) {
			t.Errorf("Record: got %v, want ErrClosed", err)
		}
		if _, err := e2.Query(); !errors.Is(err, device.ErrClosed) {
			t.Errorf("Query: got %v, want ErrClosed", err)
		}
	})
}

func TestStreamFIFO(t *testing.T) {
	// Ops on one stream run in order: a gather after a scatter to the same
	// bytes sees what the scatter wrote, without waiting in between.
	d := newDev(t, Config{})
	_, m := newSharedT(t, d, 1<<20)
	s := newStreamT(t, d)
	in := allocPinnedT(t, d, 1000*8)
	out := allocPinnedT(t, d, 1000*8)
	for i := range 1000 {
		slot := in.Slice(i*8, 8)
		copy(slot.Host(), []byte{byte(i), byte(i >> 8), 1, 2, 3, 4, 5, 6})
		seg := []device.Seg{sg(m.Base()+64, 8)} // the same bytes every time
		if err := s.Scatter(seg, slot); err != nil {
			t.Fatalf("Scatter %d: %v", i, err)
		}
		if err := s.Gather(out.Slice(i*8, 8), seg); err != nil {
			t.Fatalf("Gather %d: %v", i, err)
		}
	}
	if err := s.Synchronize(); err != nil {
		t.Fatalf("Synchronize: %v", err)
	}
	if !bytes.Equal(out.Host(), in.Host()) {
		t.Errorf("gathered bytes differ from scattered ones at %d: ops ran out of order", firstDiff(out.Host(), in.Host()))
	}
	if got, want := d.Stats().Copies, uint64(2000); got != want {
		t.Errorf("copies: got %d, want %d", got, want)
	}
}

func TestConcurrentStreams(t *testing.T) {
	d := newDev(t, Config{})
	const streams, rounds, chunk = 8, 200, 4096
	sh, m := newSharedT(t, d, streams*chunk)
	rng := newRand(t)
	fillRandom(rng, sh.Bytes())
	var wg sync.WaitGroup
	errs := make([]error, streams)
	pins := make([]device.Pinned, streams)
	for i := range streams {
		pins[i] = allocPinnedT(t, d, chunk)
		s := newStreamT(t, d)
		ev := newEventT(t, d)
		wg.Go(func() {
			seg := []device.Seg{sg(m.Base()+device.Addr(i*chunk), chunk)}
			for range rounds {
				if err := s.Gather(pins[i], seg); err != nil {
					errs[i] = err
					return
				}
				if err := s.Record(ev); err != nil {
					errs[i] = err
					return
				}
				if err := ev.Wait(); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for i := range streams {
		if errs[i] != nil {
			t.Errorf("stream %d: %v", i, errs[i])
			continue
		}
		if !bytes.Equal(pins[i].Host(), sh.Bytes()[i*chunk:(i+1)*chunk]) {
			t.Errorf("stream %d: gathered bytes differ", i)
		}
	}
	if got, want := d.Stats().Bytes, uint64(streams*rounds*chunk); got != want {
		t.Errorf("bytes: got %d, want %d", got, want)
	}
}

func TestInjectedFailure(t *testing.T) {
	tests := []struct {
		name   string
		atOpen bool // Config.Fail (STAGE_TEST_HOSTMEM_FAIL_AFTER); else FailAfter is called
		after  int64
	}{
		{"FailAfter(0)", false, 0},
		{"FailAfter(3)", false, 3},
		{"Config 0", true, 0},
		{"Config 2", true, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDev(t, Config{Fail: tc.atOpen, FailAfter: tc.after})
			if !tc.atOpen {
				d.FailAfter(tc.after)
			}
			sh, m := newSharedT(t, d, 1<<16)
			for i := range sh.Bytes() {
				sh.Bytes()[i] = 0xAB
			}
			s := newStreamT(t, d)
			const ops = 6
			pins := make([]device.Pinned, ops)
			evs := make([]device.Event, ops)
			for i := range ops {
				pins[i] = allocPinnedT(t, d, 128)
				evs[i] = newEventT(t, d)
				if err := s.Gather(pins[i], []device.Seg{sg(m.Base()+device.Addr(i*128), 128)}); err != nil {
					t.Fatalf("Gather %d: got %v, want nil (copy errors are reported through events)", i, err)
				}
				if err := s.Record(evs[i]); err != nil {
					t.Fatalf("Record %d: %v", i, err)
				}
			}
			err := s.Synchronize()
			if !errors.Is(err, ErrInjected) {
				t.Fatalf("Synchronize: got %v, want ErrInjected", err)
			}
			for i, ev := range evs {
				err := ev.Wait()
				copied := pins[i].Host()[0] == 0xAB
				if int64(i) < tc.after {
					if err != nil || !copied {
						t.Errorf("op %d (before the failure): got err %v, copied %v; want nil, true", i, err, copied)
					}
					continue
				}
				if !errors.Is(err, ErrInjected) || copied {
					t.Errorf("op %d (failed or after the failure): got err %v, copied %v; want ErrInjected, false", i, err, copied)
				}
			}
			// Sticky: later work reports the error too, and so does Synchronize.
			if err := s.Gather(pins[0], []device.Seg{sg(m.Base(), 128)}); err != nil {
				t.Fatalf("Gather after the failure: %v", err)
			}
			if err := s.Record(evs[0]); err != nil {
				t.Fatalf("Record after the failure: %v", err)
			}
			if err := evs[0].Wait(); !errors.Is(err, ErrInjected) {
				t.Errorf("event recorded after the failure: got %v, want ErrInjected", err)
			}
			if err := s.Synchronize(); !errors.Is(err, ErrInjected) {
				t.Errorf("second Synchronize: got %v, want ErrInjected", err)
			}
			// A fresh stream works: the injection fires once.
			s2 := newStreamT(t, d)
			if err := s2.Gather(pins[1], []device.Seg{sg(m.Base(), 128)}); err != nil {
				t.Fatal(err)
			}
			if err := s2.Synchronize(); err != nil {
				t.Errorf("fresh stream: got %v, want nil", err)
			}
			st := d.Stats()
			if got, want := st.Failed, uint64(1); got != want {
				t.Errorf("Stats.Failed: got %d, want %d", got, want)
			}
			if got, want := st.Skipped, uint64(ops-tc.after); got != want {
				t.Errorf("Stats.Skipped: got %d, want %d", got, want)
			}
			if got, want := st.Copies, uint64(tc.after+1); got != want {
				t.Errorf("Stats.Copies: got %d, want %d", got, want)
			}
		})
	}
}

func TestBandwidthModel(t *testing.T) {
	tests := []struct {
		name string
		opts Config
		ops  int
		size int
		min  time.Duration // generous lower bound: a model check, not a perf test
	}{
		{"64 MiB at 1 GB/s", Config{BandwidthBytesPerSec: 1e9}, 1, 64 << 20, 60 * time.Millisecond},
		{"16 x 4 MiB at 1 GB/s", Config{BandwidthBytesPerSec: 1e9}, 16, 4 << 20, 60 * time.Millisecond},
		{"10 ops at 5 ms latency", Config{Latency: 5 * time.Millisecond}, 10, 4096, 45 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDev(t, tc.opts)
			_, m := newSharedT(t, d, tc.size)
			p := allocPinnedT(t, d, tc.size)
			s := newStreamT(t, d)
			start := time.Now()
			for range tc.ops {
				if err := s.Gather(p, []device.Seg{sg(m.Base(), uint64(tc.size))}); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if got := time.Since(start); got < tc.min {
				t.Errorf("took %v, want >= %v", got, tc.min)
			}
		})
	}
}

func TestBackpressure(t *testing.T) {
	// A stream with a queue of 2 and copies of 30 ms: the 4th enqueue (one
	// running, two queued) must wait for the first copy to finish.
	const lat = 30 * time.Millisecond
	d := newDev(t, Config{Latency: lat})
	_, m := newSharedT(t, d, 4096)
	p := allocPinnedT(t, d, 8)
	d.mu.Lock()
	s := newStream(d, 99, 2)
	d.streams[s] = struct{}{}
	d.mu.Unlock()
	defer s.Close()
	seg := []device.Seg{sg(m.Base(), 8)}
	var slowest time.Duration
	for range 4 {
		start := time.Now()
		if err := s.Gather(p, seg); err != nil {
			t.Fatal(err)
		}
		slowest = max(slowest, time.Since(start))
	}
	if slowest < lat/2 {
		t.Errorf("slowest of 4 enqueues on a queue of 2: got %v, want >= %v (enqueue must block while the queue is full)", slowest, lat/2)
	}
	s2 := newStreamT(t, d)
	if got := cap(s2.(*stream).ops); got != streamQueue {
		t.Errorf("queue of NewStream: got %d, want %d", got, streamQueue)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

func TestStreamClose(t *testing.T) {
	d := newDev(t, Config{Latency: time.Millisecond})
	_, m := newSharedT(t, d, 4096)
	p := allocPinnedT(t, d, 8)
	ev := newEventT(t, d)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if err := s.Gather(p, []device.Seg{sg(m.Base(), 8)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Record(ev); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: got %v, want nil", err)
	}
	// Close drained the queue.
	if done, err := ev.Query(); !done || err != nil {
		t.Errorf("event recorded before Close: got (%v, %v), want (true, nil)", done, err)
	}
	if got, want := d.Stats().Copies, uint64(20); got != want {
		t.Errorf("copies: got %d, want %d", got, want)
	}
	checks := []struct {
		name string
		f    func() error
	}{
		{"Close", s.Close},
		{"Gather", func() error { return s.Gather(p, []device.Seg{sg(m.Base(), 8)}) }},
		{"Scatter", func() error { return s.Scatter([]device.Seg{sg(m.Base(), 8)}, p) }},
		{"Record", func() error { return s.Record(ev) }},
		{"Synchronize", s.Synchronize},
	}
	for _, c := range checks {
		if err := c.f(); !errors.Is(err, device.ErrClosed) {
			t.Errorf("%s after Close: got %v, want ErrClosed", c.name, err)
		}
	}
	if got := d.Stats().Streams; got != 0 {
		t.Errorf("open streams: got %d, want 0", got)
	}
}

func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	d := newDev(t, Config{})
	_, m := newSharedT(t, d, 1<<20)
	p := allocPinnedT(t, d, 64<<10)
	s := newStreamT(t, d)
	ev := newEventT(t, d)
	segs := make([]device.Seg, 64)
	for i := range segs {
		segs[i] = device.Seg{Addr: m.Base() + device.Addr(i*4096), Len: 1024}
	}
	dst := p.Slice(0, 64*1024)
	got := testing.AllocsPerRun(200, func() {
		if err := s.Gather(dst, segs); err != nil {
			t.Fatal(err)
		}
		if err := s.Scatter(segs, dst); err != nil {
			t.Fatal(err)
		}
		if err := s.Record(ev); err != nil {
			t.Fatal(err)
		}
		if err := ev.Wait(); err != nil {
			t.Fatal(err)
		}
	})
	if got > 0 {
		t.Errorf("allocations per Gather+Scatter+Record+Wait: got %v, want 0", got)
	}
}

func BenchmarkGather4MiB(b *testing.B) {
	const total = 4 << 20
	for _, segSize := range []int{4 << 20, 64 << 10, 16 << 10, 1 << 10} {
		b.Run(byteSize(segSize)+"-segs", func(b *testing.B) {
			d := newDev(b, Config{})
			_, m := newSharedT(b, d, 2*total)
			p := allocPinnedT(b, d, total)
			s := newStreamT(b, d)
			ev := newEventT(b, d)
			// Every other segment-sized block, like KV blocks of one layer.
			segs := make([]device.Seg, total/segSize)
			for i := range segs {
				segs[i] = device.Seg{Addr: m.Base() + device.Addr(2*i*segSize), Len: uint64(segSize)}
			}
			b.SetBytes(total)
			b.ReportAllocs()
			for b.Loop() {
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
		})
	}
}

func byteSize(n int) string {
	switch {
	case n >= 1<<20:
		return strconv.Itoa(n>>20) + "MiB"
	case n >= 1<<10:
		return strconv.Itoa(n>>10) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}

// Go memory can stand in for device memory through HandleHostAddr.
func TestHostAddrMapping(t *testing.T) {
	d := newDev(t, Config{})
	mem := make([]byte, 4096)
	for i := range mem {
		mem[i] = byte(i * 7)
	}
	m, err := d.Import(device.Handle{Kind: device.HandleHostAddr, Addr: device.Addr(uintptr(unsafe.Pointer(&mem[0]))), Size: uint64(len(mem)), FD: -1})
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	p := allocPinnedT(t, d, 100)
	s := newStreamT(t, d)
	if err := s.Gather(p, []device.Seg{sg(m.Base()+1000, 100)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.Host(), mem[1000:1100]) {
		t.Errorf("gathered bytes differ from the Go memory they came from")
	}
	if err := m.Close(); err != nil {
		t.Errorf("Close: got %v, want nil", err)
	}
	if err := m.Close(); !errors.Is(err, device.ErrClosed) {
		t.Errorf("second Close: got %v, want ErrClosed", err)
	}
	runtime.KeepAlive(mem)
}

func sg(a device.Addr, n uint64) device.Seg { return device.Seg{Addr: a, Len: n} }
