package cuda

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stage-kv/stage/device"
)

// Helpers shared by the CPU tests (against testdata/fakecuda.c) and the GPU
// tests (build tag gpu).

// randBytes returns n pseudo-random bytes from seed.
func randBytes(seed uint64, n int) []byte {
	var key [32]byte
	for i := range 8 {
		key[i] = byte(seed >> (8 * i))
	}
	b := make([]byte, n)
	r := rand.NewChaCha8(key)
	r.Read(b)
	return b
}

// poison fills b with a pattern no copy produces by chance.
func poison(b []byte, tag byte) {
	for i := range b {
		b[i] = tag ^ byte(i*7)
	}
}

// buildSO compiles C source into a shared library in a temp dir, or skips
// the test when gcc is missing.
func buildSO(t testing.TB, src string, flags ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc not found (%v): cannot build a fake libcuda", err)
	}
	dir := t.TempDir()
	c := filepath.Join(dir, "fake.c")
	so := filepath.Join(dir, "libcuda.so.1")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-o", so, c}, flags...)
	args = append(args, "-lpthread")
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return so
}

// cellSegs picks n non-overlapping segments of pool [base, base+size) in
// random order: the pool is cut into n equal cells, each holds one segment
// at a random offset (a multiple of align) with a length from lenFn, clipped
// to its cell.
func cellSegs(rng *rand.Rand, base device.Addr, size uint64, n int, align uint64, lenFn func() uint64) []device.Seg {
	cell := size / uint64(n)
	segs := make([]device.Seg, 0, n)
	for i := range n {
		l := min(lenFn(), cell)
		off := uint64(0)
		if room := cell - l; room > 0 {
			off = rng.Uint64N(room+1) / align * align
		}
		segs = append(segs, device.Seg{Addr: base + device.Addr(uint64(i)*cell+off), Len: l})
	}
	rng.Shuffle(len(segs), func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
	return segs
}

// blockSegs picks n distinct blocks of bs bytes out of pool in random order.
func blockSegs(rng *rand.Rand, base device.Addr, size uint64, n int, bs uint64) []device.Seg {
	perm := rng.Perm(int(size / bs))
	segs := make([]device.Seg, n)
	for i := range segs {
		segs[i] = device.Seg{Addr: base + device.Addr(uint64(perm[i])*bs), Len: bs}
	}
	return segs
}

// checkGatherScatter gathers segs (all inside pool, whose bytes are data)
// into a fresh pinned buffer and checks every byte, then scatters new
// random bytes back into the poisoned pool and checks the segments got them
// and nothing else changed. It restores pool to data before returning.
func checkGatherScatter(t *testing.T, d *Device, pool device.Addr, data []byte, segs []device.Seg, seed uint64) {
	t.Helper()
	checkCopies(t, d, pool, data, segs, nil, seed)
}

// checkCopies is checkGatherScatter for runs when runs is not nil (segs
// then lists their pieces, the reference): the stream moves them with
// GatherRuns and ScatterRuns.
func checkCopies(t *testing.T, d *Device, pool device.Addr, data []byte, segs []device.Seg, runs []device.Run, seed uint64) {
	t.Helper()
	total := device.SegsLen(segs)
	if total == 0 {
		t.Fatal("no bytes to move")
	}
	p, err := d.AllocPinned(int(total))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.FreePinned(p); err != nil {
			t.Error(err)
		}
	}()
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	ev, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ev.Close(); err != nil {
			t.Error(err)
		}
	}()

	// Gather.
	poison(p.Host(), 0xA5)
	want := make([]byte, 0, total)
	for _, sg := range segs {
		off := uint64(sg.Addr - pool)
		want = append(want, data[off:off+sg.Len]...)
	}
	rc := s.(device.RunCopier)
	gather := func() error { return s.Gather(p, segs) }
	scatter := func() error { return s.Scatter(segs, p) }
	if runs != nil {
		gather = func() error { return rc.GatherRuns(p, runs) }
		scatter = func() error { return rc.ScatterRuns(runs, p) }
	}
	if err := gather(); err != nil {
		t.Fatalf("Gather: %v", err)
	}
	if err := s.Record(ev); err != nil {
		t.Fatal(err)
	}
	if err := ev.Wait(); err != nil {
		t.Fatalf("Wait after Gather: %v", err)
	}
	if done, err := ev.Query(); !done || err != nil {
		t.Fatalf("Query after Wait: got (%v, %v), want (true, nil)", done, err)
	}
	if err := firstDiff(p.Host(), want, segs); err != nil {
		t.Fatalf("Gather of %d segments (%d B): %v", len(segs), total, err)
	}

	// Scatter.
	src := randBytes(seed^0x5ca77e12, int(total))
	copy(p.Host(), src)
	poisoned := make([]byte, len(data))
	poison(poisoned, 0x3C)
	if err := d.CopyHtoD(pool, poisoned); err != nil {
		t.Fatal(err)
	}
	if err := scatter(); err != nil {
		t.Fatalf("Scatter: %v", err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatalf("Synchronize after Scatter: %v", err)
	}
	got := make([]byte, len(data))
	if err := d.CopyDtoH(got, pool); err != nil {
		t.Fatal(err)
	}
	exp := poisoned
	o := uint64(0)
	for _, sg := range segs {
		off := uint64(sg.Addr - pool)
		copy(exp[off:off+sg.Len], src[o:o+sg.Len])
		o += sg.Len
	}
	if i := mismatch(got, exp); i >= 0 {
		t.Fatalf("Scatter of %d segments (%d B): pool byte %d (%#x) is %#02x, want %#02x (%s)", len(segs), total, i, uint64(pool)+uint64(i), got[i], exp[i], whichSeg(segs, pool, uint64(i)))
	}
	if err := d.CopyHtoD(pool, data); err != nil {
		t.Fatal(err)
	}
}

func mismatch(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// firstDiff reports the first byte where the gathered buffer differs, with
// the segment it belongs to.
func firstDiff(got, want []byte, segs []device.Seg) error {
	i := mismatch(got, want)
	if i < 0 {
		return nil
	}
	o := 0
	for k, sg := range segs {
		if i < o+int(sg.Len) {
			return fmt.Errorf("byte %d is %#02x, want %#02x (segment %d: %#x+%d, %d B)", i, got[i], want[i], k, uint64(sg.Addr), i-o, sg.Len)
		}
		o += int(sg.Len)
	}
	return fmt.Errorf("byte %d differs", i)
}

func whichSeg(segs []device.Seg, pool device.Addr, off uint64) string {
	a := uint64(pool) + off
	for k, sg := range segs {
		if a >= uint64(sg.Addr) && a < uint64(sg.Addr)+sg.Len {
			return fmt.Sprintf("inside segment %d", k)
		}
	}
	return "outside every segment"
}

// oddLens draws lengths that stress the kernel's head/body/tail paths.
func oddLens(rng *rand.Rand) func() uint64 {
	choices := []uint64{1, 2, 3, 15, 16, 17, 63, 64, 65, 4095, 4096, 4097, 16383, 16384, 65535, 65536 + 7, 200003}
	return func() uint64 { return choices[rng.IntN(len(choices))] }
}

// checkConcurrent runs workers goroutines at once, each with its own stream
// and pinned buffer, gathering random blocks of pool and checking them.
// Each worker locks its OS thread and never unlocks it, so the thread exits
// with the worker and later calls land on threads that have never had a
// CUDA context current: the backend must make its context current itself.
// Events are recorded by a worker and waited on by another goroutine.
func checkConcurrent(t *testing.T, d *Device, pool device.Addr, data []byte, workers, iters int) {
	t.Helper()
	const blocks, bs = 64, 4096
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread dies with us
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			s, err := d.NewStream()
			if err != nil {
				t.Error(err)
				return
			}
			defer s.Close()
			ev, err := d.NewEvent()
			if err != nil {
				t.Error(err)
				return
			}
			defer ev.Close()
			p, err := d.AllocPinned(blocks * bs)
			if err != nil {
				t.Error(err)
				return
			}
			defer d.FreePinned(p)
			for i := range iters {
				segs := blockSegs(rng, pool, uint64(len(data)), blocks, bs)
				poison(p.Host(), byte(w))
				if err := s.Gather(p, segs); err != nil {
					t.Errorf("worker %d gather %d: %v", w, i, err)
					return
				}
				if err := s.Record(ev); err != nil {
					t.Error(err)
					return
				}
				waited := make(chan error)
				go func() { waited <- ev.Wait() }() // another goroutine, maybe another thread
				if err := <-waited; err != nil {
					t.Errorf("worker %d wait %d: %v", w, i, err)
					return
				}
				if err := firstDiff(p.Host(), gathered(data, pool, segs), segs); err != nil {
					t.Errorf("worker %d gather %d: %v", w, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// gathered is what a gather of segs out of pool (holding data) produces.
func gathered(data []byte, pool device.Addr, segs []device.Seg) []byte {
	var out []byte
	for _, sg := range segs {
		off := uint64(sg.Addr - pool)
		out = append(out, data[off:off+sg.Len]...)
	}
	return out
}

// devicePool allocates n bytes of device memory filled with random bytes.
func devicePool(t testing.TB, d *Device, n int, seed uint64) (device.Addr, []byte) {
	t.Helper()
	pool, err := d.AllocDevice(uint64(n))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.FreeDevice(pool); err != nil {
			t.Error(err)
		}
	})
	data := randBytes(seed, n)
	if err := d.CopyHtoD(pool, data); err != nil {
		t.Fatal(err)
	}
	return pool, data
}
