// Package devicetest is the conformance suite of device.Device: what every
// backend must do with gathers, scatters, strided runs, events and
// synchronous copies, checked byte for byte. hostmem runs it, so do the
// vendor backends against their emulated runtimes (cuda, acl and hip over
// testdata/fake*.c) and real CUDA under the gpu build tag; a backend's own
// tests keep only what is its own (copy modes, fault injection, its
// runtime's counters).
//
// The suite moves bytes between device memory and pinned buffers through
// the streams under test, and fills and reads that memory back through
// Memory, the engine-side calls each backend offers for tests and engines.
package devicetest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/stage-kv/stage/device"
)

// Memory is device memory outside the streams under test: allocated,
// filled and read back synchronously. cuda, acl and hip Devices have these
// methods themselves.
type Memory interface {
	AllocDevice(n uint64) (device.Addr, error)
	FreeDevice(a device.Addr) error
	CopyHtoD(dst device.Addr, src []byte) error
	CopyDtoH(dst []byte, src device.Addr) error
}

// Options sizes the suite; the zero value suits every backend.
type Options struct {
	PoolSize int // device memory the cases cut segments from; 0: 8 MiB
	Workers  int // goroutines of the concurrent case; 0: 4
	Iters    int // gathers per worker; 0: 20
}

// Run runs the whole suite against d, with m the same device's memory.
func Run(t *testing.T, d device.Device, m Memory, o Options) {
	t.Helper()
	if o.PoolSize == 0 {
		o.PoolSize = 8 << 20
	}
	if o.Workers == 0 {
		o.Workers = 4
	}
	if o.Iters == 0 {
		o.Iters = 20
	}
	pool, data := Pool(t, m, o.PoolSize, 1)
	size := uint64(o.PoolSize)
	t.Run("gather-scatter", func(t *testing.T) {
		for _, c := range SegCases(pool, size) {
			t.Run(c.Name, func(t *testing.T) { CheckGatherScatter(t, d, m, pool, data, c.Segs, c.Seed) })
		}
	})
	t.Run("runs", func(t *testing.T) {
		for _, c := range RunCases(pool, size) {
			t.Run(c.Name, func(t *testing.T) { CheckRuns(t, d, m, pool, data, c.Runs, c.Seed) })
		}
	})
	t.Run("sync", func(t *testing.T) { checkSync(t, d, m, pool, data) })
	t.Run("events", func(t *testing.T) { checkEvents(t, d, pool, data) })
	t.Run("concurrent", func(t *testing.T) { CheckConcurrent(t, d, pool, data, o.Workers, o.Iters) })
}

// SegCase is one segment layout of the suite.
type SegCase struct {
	Name string
	Segs []device.Seg
	Seed uint64 // of the bytes scattered
}

// SegCases are the layouts every backend must gather and scatter inside a
// pool of size bytes (at least 1 MiB): KV-sized blocks out of order, odd
// lengths around powers of two, thousands of small pieces, one large
// range, empty segments among others, adjacent ones that continue each
// other.
func SegCases(pool device.Addr, size uint64) []SegCase {
	rng := rand.New(rand.NewPCG(2, size))
	blocks := min(300, int(size/(16<<10)))
	return []SegCase{
		{"16KiB-blocks", BlockSegs(rng, pool, size, blocks, 16<<10), 3},
		{"odd", CellSegs(rng, pool, size, 64, 1, OddLens(rng)), 4},
		{"many-small", CellSegs(rng, pool, size, 2500, 1, func() uint64 { return 1 + rng.Uint64N(300) }), 5},
		{"one-segment", []device.Seg{{Addr: pool + 3, Len: size - 10}}, 6},
		{"with-empty", []device.Seg{{Addr: pool + 100, Len: 0}, {Addr: pool + 4096, Len: 70000}, {Addr: pool, Len: 0}, {Addr: pool + 1<<20 - 5, Len: 5}}, 7},
		{"adjacent", []device.Seg{{Addr: pool + 100, Len: 10}, {Addr: pool + 110, Len: 20}, {Addr: pool + 130, Len: 4096}, {Addr: pool + 3*16384, Len: 16384}, {Addr: pool, Len: 16384}}, 8},
	}
}

// RunCase is one strided layout of the suite.
type RunCase struct {
	Name string
	Runs []device.Run
	Seed uint64
}

// RunCases are strided layouts inside a pool of size bytes (at least
// 1 MiB): a KV block whose heads lie apart (vLLM's HND), rows of pieces
// that continue each other, and empty dimensions.
func RunCases(pool device.Addr, size uint64) []RunCase {
	return []RunCase{
		{"hnd", []device.Run{{Addr: pool + 64, Len: 128, N1: 16, S1: 4096, N2: 8, S2: 128}}, 11},
		{"contiguous-rows", []device.Run{{Addr: pool + 1000, Len: 256, N1: 4, S1: 256, N2: 16, S2: 2048}}, 12},
		{"mixed", []device.Run{
			{Addr: pool + device.Addr(size/2), Len: 1, N1: 100, S1: 3, N2: 2, S2: 1000},
			{Addr: pool + 77, Len: 4000, N1: 3, S1: 8192, N2: 1},
		}, 13},
	}
}

// Pool allocates n bytes of device memory holding RandBytes(seed, n),
// freed when the test ends.
func Pool(t testing.TB, m Memory, n int, seed uint64) (device.Addr, []byte) {
	t.Helper()
	pool, err := m.AllocDevice(uint64(n))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.FreeDevice(pool); err != nil {
			t.Errorf("FreeDevice: %v", err)
		}
	})
	data := RandBytes(seed, n)
	if err := m.CopyHtoD(pool, data); err != nil {
		t.Fatal(err)
	}
	return pool, data
}

// RandBytes returns n pseudo-random bytes from seed.
func RandBytes(seed uint64, n int) []byte {
	var key [32]byte
	for i := range 8 {
		key[i] = byte(seed >> (8 * i))
	}
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	return b
}

// Poison fills b with a pattern no copy produces by chance.
func Poison(b []byte, tag byte) {
	for i := range b {
		b[i] = tag ^ byte(i*7)
	}
}

// CellSegs picks n non-overlapping segments of [base, base+size) in
// random order: the range is cut into n equal cells, each holds one
// segment at a random offset (a multiple of align) with a length from
// lenFn, clipped to its cell.
func CellSegs(rng *rand.Rand, base device.Addr, size uint64, n int, align uint64, lenFn func() uint64) []device.Seg {
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

// BlockSegs picks n distinct blocks of bs bytes of [base, base+size) in
// random order.
func BlockSegs(rng *rand.Rand, base device.Addr, size uint64, n int, bs uint64) []device.Seg {
	perm := rng.Perm(int(size / bs))
	segs := make([]device.Seg, n)
	for i := range segs {
		segs[i] = device.Seg{Addr: base + device.Addr(uint64(perm[i])*bs), Len: bs}
	}
	return segs
}

// OddLens draws lengths around powers of two and pages: what stresses a
// copy kernel's head, body and tail paths.
func OddLens(rng *rand.Rand) func() uint64 {
	choices := []uint64{1, 2, 3, 15, 16, 17, 63, 64, 65, 4095, 4096, 4097, 16383, 16384, 65535, 65536 + 7, 200003}
	return func() uint64 { return choices[rng.IntN(len(choices))] }
}

// Gathered is what a gather of segs out of pool (holding data) produces.
func Gathered(data []byte, pool device.Addr, segs []device.Seg) []byte {
	out := make([]byte, 0, device.SegsLen(segs))
	for _, sg := range segs {
		off := uint64(sg.Addr - pool)
		out = append(out, data[off:off+sg.Len]...)
	}
	return out
}

// Scattered is pool's bytes (before) after a scatter of src into segs.
func Scattered(before []byte, pool device.Addr, segs []device.Seg, src []byte) []byte {
	out := bytes.Clone(before)
	o := uint64(0)
	for _, sg := range segs {
		off := uint64(sg.Addr - pool)
		copy(out[off:off+sg.Len], src[o:o+sg.Len])
		o += sg.Len
	}
	return out
}

// Mismatch returns the index of the first byte where a and b differ, or
// -1 when they are equal (the shorter length when one is a prefix).
func Mismatch(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// FirstDiff reports the first byte where a gathered buffer differs from
// want, with the segment it belongs to, or nil.
func FirstDiff(got, want []byte, segs []device.Seg) error {
	if len(got) != len(want) {
		return fmt.Errorf("got %d B, want %d B", len(got), len(want))
	}
	i := Mismatch(got, want)
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
	return fmt.Errorf("byte %d is %#02x, want %#02x", i, got[i], want[i])
}

// PoolDiff reports the first byte of a pool (at address pool) where got
// differs from want, saying whether it lies in one of segs, or nil.
func PoolDiff(got, want []byte, pool device.Addr, segs []device.Seg) error {
	i := Mismatch(got, want)
	if i < 0 {
		return nil
	}
	if i == min(len(got), len(want)) {
		return fmt.Errorf("got %d B, want %d B", len(got), len(want))
	}
	where := "outside every segment"
	a := uint64(pool) + uint64(i)
	for k, sg := range segs {
		if a >= uint64(sg.Addr) && a < uint64(sg.Addr)+sg.Len {
			where = fmt.Sprintf("inside segment %d", k)
			break
		}
	}
	return fmt.Errorf("pool byte %d (%#x) is %#02x, want %#02x (%s)", i, a, got[i], want[i], where)
}

// CheckConcurrent runs workers goroutines at once, each with its own
// stream, event and pinned buffer, gathering random blocks of pool and
// checking them. Each worker locks its OS thread and never unlocks it, so
// the thread exits with the worker and later calls land on threads that
// never had the device current: a backend whose runtime binds state to
// threads (a CUDA context, a HIP current device) must set it itself.
// Events are recorded by a worker and waited on by another goroutine.
func CheckConcurrent(t *testing.T, d device.Device, pool device.Addr, data []byte, workers, iters int) {
	t.Helper()
	const blocks, bs = 64, 4096
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread dies with us
			if err := gatherLoop(d, pool, data, w, iters, blocks, bs); err != nil {
				t.Errorf("worker %d: %v", w, err)
			}
		}()
	}
	wg.Wait()
}

func gatherLoop(d device.Device, pool device.Addr, data []byte, w, iters, blocks int, bs uint64) (err error) {
	rng := rand.New(rand.NewPCG(uint64(w), 99))
	k, err := newKit(d, blocks*int(bs))
	if err != nil {
		return err
	}
	defer func() {
		if cerr := k.close(d); err == nil {
			err = cerr
		}
	}()
	for i := range iters {
		segs := BlockSegs(rng, pool, uint64(len(data)), blocks, bs)
		Poison(k.p.Host(), byte(w))
		if err := k.s.Gather(k.p, segs); err != nil {
			return fmt.Errorf("gather %d: %w", i, err)
		}
		if err := k.s.Record(k.ev); err != nil {
			return fmt.Errorf("record %d: %w", i, err)
		}
		waited := make(chan error)
		go func() { waited <- k.ev.Wait() }() // another goroutine, maybe another thread
		if err := <-waited; err != nil {
			return fmt.Errorf("wait %d: %w", i, err)
		}
		if err := FirstDiff(k.p.Host(), Gathered(data, pool, segs), segs); err != nil {
			return fmt.Errorf("gather %d: %w", i, err)
		}
	}
	return nil
}
