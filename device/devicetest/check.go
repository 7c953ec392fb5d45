package devicetest

import (
	"errors"
	"testing"

	"github.com/stage-kv/stage/device"
)

// kit is a stream, an event and a pinned buffer.
type kit struct {
	s  device.Stream
	ev device.Event
	p  device.Pinned
}

func newKit(d device.Device, n int) (kit, error) {
	var k kit
	var err error
	if k.p, err = d.AllocPinned(n); err != nil {
		return k, err
	}
	if k.s, err = d.NewStream(); err != nil {
		return k, errors.Join(err, d.FreePinned(k.p))
	}
	if k.ev, err = d.NewEvent(); err != nil {
		return k, errors.Join(err, k.s.Close(), d.FreePinned(k.p))
	}
	return k, nil
}

func (k kit) close(d device.Device) error {
	return errors.Join(k.ev.Close(), k.s.Close(), d.FreePinned(k.p))
}

// newKitT is newKit closing at the end of the test, failing it on errors.
func newKitT(t *testing.T, d device.Device, n int) kit {
	t.Helper()
	k, err := newKit(d, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.close(d); err != nil {
			t.Error(err)
		}
	})
	return k
}

// mover runs one gather into a pinned buffer and one scatter out of it.
type mover struct {
	gather  func(s device.Stream, p device.Pinned) error
	scatter func(s device.Stream, p device.Pinned) error
}

// CheckGatherScatter gathers segs (inside pool, whose bytes are data) into
// a fresh pinned buffer and checks every byte, then scatters new bytes
// into the poisoned pool and checks that the segments got them and
// nothing else changed. It restores pool to data before returning.
func CheckGatherScatter(t *testing.T, d device.Device, m Memory, pool device.Addr, data []byte, segs []device.Seg, seed uint64) {
	t.Helper()
	checkMove(t, d, m, pool, data, segs, seed, mover{
		gather:  func(s device.Stream, p device.Pinned) error { return s.Gather(p, segs) },
		scatter: func(s device.Stream, p device.Pinned) error { return s.Scatter(segs, p) },
	})
}

// CheckRuns is CheckGatherScatter for strided runs, moved with GatherRuns
// and ScatterRuns where the stream is a device.RunCopier, else as their
// pieces (device.AppendRunSegs), the reference either way.
func CheckRuns(t *testing.T, d device.Device, m Memory, pool device.Addr, data []byte, runs []device.Run, seed uint64) {
	t.Helper()
	segs := device.AppendRunSegs(nil, runs)
	checkMove(t, d, m, pool, data, segs, seed, mover{
		gather: func(s device.Stream, p device.Pinned) error {
			if rc, ok := s.(device.RunCopier); ok {
				return rc.GatherRuns(p, runs)
			}
			return s.Gather(p, segs)
		},
		scatter: func(s device.Stream, p device.Pinned) error {
			if rc, ok := s.(device.RunCopier); ok {
				return rc.ScatterRuns(runs, p)
			}
			return s.Scatter(segs, p)
		},
	})
}

func checkMove(t *testing.T, d device.Device, m Memory, pool device.Addr, data []byte, segs []device.Seg, seed uint64, mv mover) {
	t.Helper()
	total := device.SegsLen(segs)
	if total == 0 {
		t.Fatal("no bytes to move")
	}
	k := newKitT(t, d, int(total))

	Poison(k.p.Host(), 0xA5)
	if err := mv.gather(k.s, k.p); err != nil {
		t.Fatalf("Gather: %v", err)
	}
	if err := k.s.Record(k.ev); err != nil {
		t.Fatal(err)
	}
	if err := k.ev.Wait(); err != nil {
		t.Fatalf("Wait after Gather: %v", err)
	}
	if done, err := k.ev.Query(); !done || err != nil {
		t.Fatalf("Query after Wait: got (%v, %v), want (true, nil)", done, err)
	}
	if err := FirstDiff(k.p.Host(), Gathered(data, pool, segs), segs); err != nil {
		t.Fatalf("Gather of %d segments (%d B): %v", len(segs), total, err)
	}

	src := RandBytes(seed^0x5ca77e12, int(total))
	copy(k.p.Host(), src)
	poisoned := make([]byte, len(data))
	Poison(poisoned, 0x3C)
	if err := m.CopyHtoD(pool, poisoned); err != nil {
		t.Fatal(err)
	}
	if err := mv.scatter(k.s, k.p); err != nil {
		t.Fatalf("Scatter: %v", err)
	}
	if err := k.s.Synchronize(); err != nil {
		t.Fatalf("Synchronize after Scatter: %v", err)
	}
	got := make([]byte, len(data))
	if err := m.CopyDtoH(got, pool); err != nil {
		t.Fatal(err)
	}
	if err := PoolDiff(got, Scattered(poisoned, pool, segs, src), pool, segs); err != nil {
		t.Fatalf("Scatter of %d segments (%d B): %v", len(segs), total, err)
	}
	if err := m.CopyHtoD(pool, data); err != nil {
		t.Fatal(err)
	}
}

// checkSync moves a few KiB with GatherSync and ScatterSync where the
// device is a device.SyncCopier.
func checkSync(t *testing.T, d device.Device, m Memory, pool device.Addr, data []byte) {
	sc, ok := d.(device.SyncCopier)
	if !ok {
		t.Skipf("%s has no synchronous copies", d)
	}
	segs := []device.Seg{{Addr: pool + 8192, Len: 100}, {Addr: pool + 1, Len: 3000}, {Addr: pool + 20000, Len: 900}}
	total := int(device.SegsLen(segs))
	p, err := d.AllocPinned(total)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.FreePinned(p); err != nil {
			t.Error(err)
		}
	}()
	Poison(p.Host(), 0x11)
	if err := sc.GatherSync(p, segs); err != nil {
		t.Fatalf("GatherSync: %v", err)
	}
	if err := FirstDiff(p.Host(), Gathered(data, pool, segs), segs); err != nil {
		t.Fatalf("GatherSync: %v", err)
	}
	src := RandBytes(21, total)
	copy(p.Host(), src)
	if err := sc.ScatterSync(segs, p); err != nil {
		t.Fatalf("ScatterSync: %v", err)
	}
	got := make([]byte, len(data))
	if err := m.CopyDtoH(got, pool); err != nil {
		t.Fatal(err)
	}
	if err := PoolDiff(got, Scattered(data, pool, segs, src), pool, segs); err != nil {
		t.Fatalf("ScatterSync: %v", err)
	}
	if err := m.CopyHtoD(pool, data); err != nil {
		t.Fatal(err)
	}
}

// checkEvents: an event recorded behind a gather completes with it, may be
// recorded again once complete, and an event recorded on an idle stream
// completes too; one event serves two streams in turn.
func checkEvents(t *testing.T, d device.Device, pool device.Addr, data []byte) {
	k := newKitT(t, d, 64<<10)
	other, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := other.Close(); err != nil {
			t.Error(err)
		}
	}()
	segs := []device.Seg{{Addr: pool + 5, Len: 32 << 10}, {Addr: pool + 1<<20, Len: 32 << 10}}
	for round, s := range []device.Stream{k.s, k.s, other} {
		Poison(k.p.Host(), byte(round))
		if err := s.Gather(k.p.Slice(0, 64<<10), segs); err != nil {
			t.Fatalf("round %d: Gather: %v", round, err)
		}
		if err := s.Record(k.ev); err != nil {
			t.Fatalf("round %d: Record: %v", round, err)
		}
		if err := k.ev.Wait(); err != nil {
			t.Fatalf("round %d: Wait: %v", round, err)
		}
		if done, err := k.ev.Query(); !done || err != nil {
			t.Fatalf("round %d: Query after Wait = (%v, %v), want (true, nil)", round, done, err)
		}
		if err := FirstDiff(k.p.Host(), Gathered(data, pool, segs), segs); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	if err := other.Record(k.ev); err != nil {
		t.Fatalf("Record on an idle stream: %v", err)
	}
	if err := k.ev.Wait(); err != nil {
		t.Fatalf("Wait on an idle stream's event: %v", err)
	}
	if err := other.Synchronize(); err != nil {
		t.Fatalf("Synchronize of an idle stream: %v", err)
	}
}
