package node

import (
	"errors"
	"os"
	"testing"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/hostmem"
	"github.com/stage-kv/stage/wire"
)

// cacheEnv is an importer's device and an exporter's memfd allocation.
type cacheEnv struct {
	dev   *hostmem.Dev
	alloc *hostmem.Shared
	c     *peerMaps
}

func newCacheEnv(t *testing.T) *cacheEnv {
	t.Helper()
	dv, err := hostmem.Open(0, device.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &cacheEnv{dev: dv.(*hostmem.Dev)}
	t.Cleanup(func() {
		if err := e.dev.Close(); err != nil {
			t.Errorf("device close (leaked mappings?): %v", err)
		}
	})
	e.alloc, err = hostmem.NewShared("peer-alloc", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.alloc.Close() })
	e.c = newPeerMaps(e.dev.Import)
	return e
}

func (e *cacheEnv) handle(id, off, n uint64) *wire.RegionHandle {
	return &wire.RegionHandle{RegionID: id, Kind: uint8(device.HandleMemfd), Access: wire.AccessRemoteWrite,
		AllocKey: "memfd:1:2", AllocSize: 1 << 20, Offset: off, Length: n}
}

func (e *cacheEnv) mappings() int { return e.dev.Stats().Mappings }

func TestPeerMapsOpenOnceAndRefcount(t *testing.T) {
	e := newCacheEnv(t)
	fds := countFDs()
	a1, err := e.c.acquire(e.handle(1, 0, 4096), e.alloc.FD())
	if err != nil {
		t.Fatal(err)
	}
	a2, err := e.c.acquire(e.handle(2, 4096, 4096), e.alloc.FD()) // another view of the same allocation
	if err != nil {
		t.Fatal(err)
	}
	if a1 != a2 || e.c.opened.Load() != 1 || e.mappings() != 1 {
		t.Fatalf("two views of one allocation: got %d imports, %d mappings, same entry %v; want 1, 1, true", e.c.opened.Load(), e.mappings(), a1 == a2)
	}
	// Two transfer references, two region references.
	for _, a := range []*peerAlloc{a1, a2} {
		if err := e.c.release(a); err != nil {
			t.Fatal(err)
		}
	}
	if e.mappings() != 1 {
		t.Fatalf("after the copies: got %d mappings, want 1 (regions still name it)", e.mappings())
	}
	if err := e.c.revoke(1); err != nil {
		t.Fatal(err)
	}
	if e.mappings() != 1 {
		t.Fatalf("after revoking one region: got %d mappings, want 1", e.mappings())
	}
	if err := e.c.revoke(2); err != nil {
		t.Fatal(err)
	}
	if e.mappings() != 0 || e.c.open.Load() != 0 {
		t.Fatalf("after revoking both regions: got %d mappings (%d counted), want 0", e.mappings(), e.c.open.Load())
	}
	if err := e.c.revoke(2); err != nil {
		t.Fatalf("revoking twice: got %v, want nil", err)
	}
	if got := countFDs(); got != fds {
		t.Fatalf("fds: got %d, want %d (the caller's fd is never kept)", got, fds)
	}
}

func TestPeerMapsCloseAllWaitsForCopies(t *testing.T) {
	e := newCacheEnv(t)
	a, err := e.c.acquire(e.handle(1, 0, 4096), e.alloc.FD())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.c.closeAll(); err != nil {
		t.Fatal(err)
	}
	if e.mappings() != 1 {
		t.Fatalf("closeAll with a copy running: got %d mappings, want 1 until it releases", e.mappings())
	}
	if _, err := e.c.acquire(e.handle(3, 0, 1), e.alloc.FD()); err == nil {
		t.Fatal("acquire after closeAll: got nil error")
	}
	if err := e.c.release(a); err != nil {
		t.Fatal(err)
	}
	if e.mappings() != 0 {
		t.Fatalf("after the copy released: got %d mappings, want 0", e.mappings())
	}
}

func TestPeerMapsRefusesBadHandles(t *testing.T) {
	e := newCacheEnv(t)
	if _, err := e.c.acquire(e.handle(1, 1<<20, 1), e.alloc.FD()); err == nil {
		t.Fatal("region past its allocation: got nil error")
	}
	if _, err := e.c.acquire(e.handle(1, 0, 0), e.alloc.FD()); err == nil {
		t.Fatal("empty region: got nil error")
	}
	h := e.handle(1, 0, 1)
	h.AllocSize = 2 << 20 // more than the memfd holds
	if _, err := e.c.acquire(h, e.alloc.FD()); err == nil {
		t.Fatal("allocation larger than the memfd: got nil error")
	}
	a, err := e.c.acquire(e.handle(1, 0, 1), e.alloc.FD())
	if err != nil {
		t.Fatal(err)
	}
	h = e.handle(2, 0, 1)
	h.AllocSize = 1<<20 + 1
	if _, err := e.c.acquire(h, e.alloc.FD()); err == nil {
		t.Fatal("same allocation claimed larger: got nil error")
	}
	boom := errors.New("injected")
	failing := newPeerMaps(func(device.Handle) (device.Mapping, error) { return nil, boom })
	if _, err := failing.acquire(e.handle(1, 0, 1), e.alloc.FD()); !errors.Is(err, boom) {
		t.Fatalf("failing import: got %v, want the import's error", err)
	}
	_ = e.c.release(a)
	if err := e.c.closeAll(); err != nil {
		t.Fatal(err)
	}
	if e.mappings() != 0 {
		t.Fatalf("got %d mappings after closeAll, want 0", e.mappings())
	}
}

// countFDs counts this process's open file descriptors (-1 if unknown).
func countFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents) - 1 // the directory being read
}
