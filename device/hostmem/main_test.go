package hostmem

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"go.uber.org/goleak"

	"github.com/stage-kv/stage/device"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newDev opens a device and closes it at the end of the test, failing the
// test if anything was still open then (resources made with the helpers
// below are released before, in reverse order).
func newDev(t testing.TB, cfg Config) *Dev {
	t.Helper()
	dv, err := Open(0, device.Options{Backend: cfg})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	d := dv.(*Dev)
	t.Cleanup(func() {
		if err := d.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			t.Errorf("device Close: got %v, want nil", err)
		}
	})
	return d
}

func newStreamT(t testing.TB, d *Dev) device.Stream {
	t.Helper()
	s, err := d.NewStream()
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			t.Errorf("stream Close: %v", err)
		}
	})
	return s
}

func newEventT(t testing.TB, d *Dev) device.Event {
	t.Helper()
	e, err := d.NewEvent()
	if err != nil {
		t.Fatalf("NewEvent: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			t.Errorf("event Close: %v", err)
		}
	})
	return e
}

func allocPinnedT(t testing.TB, d *Dev, n int) device.Pinned {
	t.Helper()
	p, err := d.AllocPinned(n)
	if err != nil {
		t.Fatalf("AllocPinned(%d): %v", n, err)
	}
	t.Cleanup(func() {
		if err := d.FreePinned(p); err != nil && !errors.Is(err, device.ErrBadHandle) {
			t.Errorf("FreePinned: %v", err)
		}
	})
	return p
}

// newSharedT makes engine-side memory and imports it into d: it returns the
// engine's view and the sidecar's mapping, two mappings of the same pages.
func newSharedT(t testing.TB, d *Dev, size int) (*Shared, device.Mapping) {
	t.Helper()
	sh, err := NewShared("test", size)
	if err != nil {
		t.Fatalf("NewShared: %v", err)
	}
	t.Cleanup(func() {
		if err := sh.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			t.Errorf("Shared Close: %v", err)
		}
	})
	m, err := d.Import(sh.Handle())
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			t.Errorf("mapping Close: %v", err)
		}
	})
	return sh, m
}

func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// layout places segments of the given lengths at random, non-overlapping
// offsets of [0, size) and returns them in random order (so copy order is not
// address order), with their offsets.
func layout(rng *rand.Rand, base device.Addr, size uint64, lens []uint64) (segs []device.Seg, offs []uint64) {
	var total uint64
	for _, l := range lens {
		total += l
	}
	if total > size {
		panic("layout: segments do not fit")
	}
	maxGap := (size - total) / uint64(len(lens)+1)
	order := rng.Perm(len(lens))
	offs = make([]uint64, len(lens))
	var at uint64
	for _, i := range order {
		at += rng.Uint64N(maxGap + 1)
		offs[i] = at
		at += lens[i]
	}
	segs = make([]device.Seg, len(lens))
	for i, l := range lens {
		segs[i] = device.Seg{Addr: base + device.Addr(offs[i]), Len: l}
	}
	return segs, offs
}

func fillRandom(rng *rand.Rand, b []byte) {
	for len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, rng.Uint64())
		b = b[8:]
	}
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}
