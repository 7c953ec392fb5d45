package staging_test

import (
	"bytes"
	"testing"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/hostmem"
	"github.com/stage-kv/stage/staging"
)

// TestCopierRuns: on a stream without device.RunCopier (hostmem), runs are
// expanded to segments: a gather lands each run's pieces in row-major
// order, and a scatter of those bytes through other runs puts each piece
// where its run says.
func TestCopierRuns(t *testing.T) {
	mem, m, pool, c := copierRig(t, "runs")
	src := mem.Bytes()
	for i := range src {
		src[i] = byte(i*13 + i>>8)
	}
	base := m.Base()
	// 3 rows of 4 pieces of 16 B (pieces 256 B apart, rows 32 B apart),
	// then one piece of 5 B, then 2 contiguous pieces.
	runs := []device.Run{
		{Addr: base + 100, Len: 16, N1: 4, S1: 256, N2: 3, S2: 32},
		{Addr: base + 5000, Len: 5, N1: 1, N2: 1},
		{Addr: base + 6000, Len: 8, N1: 2, S1: 8, N2: 1},
	}
	var want []byte
	for _, r := range runs {
		for i2 := range uint64(r.N2) {
			for i1 := range uint64(r.N1) {
				a := uint64(r.Addr-base) + i2*r.S2 + i1*r.S1
				want = append(want, src[a:a+uint64(r.Len)]...)
			}
		}
	}
	slot := pool.Slot(0).Slice(0, len(want))
	done := make(chan error, 1)
	if err := c.GatherRuns(slot, runs, func(err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(slot.Host(), want) {
		t.Fatalf("gathered %x, want %x", slot.Host()[:32], want[:32])
	}
	// Scatter the slot into the second half, pieces reversed in rows.
	out := []device.Run{{Addr: base + 40000, Len: 16, N1: 4, S1: 16, N2: 3, S2: 1024}, {Addr: base + 50000, Len: 21, N1: 1, N2: 1}}
	if err := c.ScatterRuns(out, slot, func(err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i2 := range 3 {
		if got := src[40000+i2*1024 : 40000+i2*1024+64]; !bytes.Equal(got, want[i2*64:i2*64+64]) {
			t.Fatalf("scattered row %d: %x, want %x", i2, got, want[i2*64:i2*64+64])
		}
	}
	if !bytes.Equal(src[50000:50021], want[192:]) {
		t.Fatal("scattered tail differs")
	}
}

// sharedMapping makes n bytes of shared memory and imports them into dev.
func sharedMapping(t *testing.T, dev *hostmem.Dev, name string, n int) (*hostmem.Shared, device.Mapping) {
	t.Helper()
	mem, err := hostmem.NewShared(name, n)
	if err != nil {
		t.Fatal(err)
	}
	m, err := dev.Import(mem.Handle())
	if err != nil {
		mem.Close()
		t.Fatal(err)
	}
	return mem, m
}

// copierRig opens a device with 64 KiB of shared memory imported, a pool
// of one 4 KiB slot and a Copier of depth 2, all released at cleanup.
func copierRig(t *testing.T, name string) (*hostmem.Shared, device.Mapping, *staging.Pool, *staging.Copier) {
	t.Helper()
	dev := openDev(t)
	t.Cleanup(func() { dev.Close() })
	mem, m := sharedMapping(t, dev, name, 1<<16)
	t.Cleanup(func() { mem.Close(); m.Close() })
	pool, err := staging.NewPool(dev, 4096, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	c, err := staging.NewCopier(dev, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return mem, m, pool, c
}
