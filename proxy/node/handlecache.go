package node

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/wire"
)

// peerMaps caches the allocations this sidecar imported from the handles a
// same-node peer handed it over one session (the importer's side). Each
// allocation is opened once and counted: one reference per region of it
// the peer named (dropped by Revoke) and one per copy using it. The last
// reference closes the mapping; closeAll (the session went away) drops
// every region's reference at once.
type peerMaps struct {
	imp func(device.Handle) (device.Mapping, error)

	mu      sync.Mutex
	allocs  map[string]*peerAlloc // by the exporter's allocation key
	regions map[uint64]*peerAlloc // by the exporter's region id
	closed  bool
	open    atomic.Int64 // mappings open
	opened  atomic.Int64 // imports done, ever (tests)
}

// peerAlloc is one imported peer allocation.
type peerAlloc struct {
	key  string
	m    device.Mapping
	size uint64 // the size the exporter claimed when it was imported
	refs int    // guarded by peerMaps.mu
}

func newPeerMaps(imp func(device.Handle) (device.Mapping, error)) *peerMaps {
	return &peerMaps{imp: imp, allocs: map[string]*peerAlloc{}, regions: map[uint64]*peerAlloc{}}
}

// acquire returns the mapping of h's allocation, importing it (with fd for
// the fd kinds; fd stays the caller's) on first use, and takes a reference
// for the caller to release.
func (c *peerMaps) acquire(h *wire.RegionHandle, fd int) (*peerAlloc, error) {
	if h.Length == 0 || !region.InRange(h.Offset, h.Length, h.AllocSize) {
		return nil, fmt.Errorf("region handle %d: offset %d + length %d outside its %d B allocation", h.RegionID, h.Offset, h.Length, h.AllocSize)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("the peer session is closed")
	}
	a := c.allocs[h.AllocKey]
	if a == nil {
		m, err := c.imp(device.Handle{Kind: device.HandleKind(h.Kind), Bytes: h.Raw, FD: fd, Size: h.AllocSize})
		if err != nil {
			return nil, err
		}
		if m.Size() < h.AllocSize {
			_ = m.Close()
			return nil, fmt.Errorf("imported %s allocation has %d B, the peer claimed %d B", device.HandleKind(h.Kind), m.Size(), h.AllocSize)
		}
		a = &peerAlloc{key: h.AllocKey, m: m, size: h.AllocSize}
		c.allocs[h.AllocKey] = a
		c.open.Add(1)
		c.opened.Add(1)
	} else if a.size < h.AllocSize {
		return nil, fmt.Errorf("allocation %s already imported with %d B, now claimed %d B", h.AllocKey, a.size, h.AllocSize)
	}
	if old, seen := c.regions[h.RegionID]; !seen {
		c.regions[h.RegionID] = a
		a.refs++
	} else if old != a {
		return nil, fmt.Errorf("region handle %d names allocation %s, earlier %s", h.RegionID, h.AllocKey, old.key)
	}
	a.refs++
	return a, nil
}

// use takes one more reference on a, an allocation still imported (the
// peer's wake buffer, which a push writes to before its handles come).
func (c *peerMaps) use(a *peerAlloc) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || a == nil || a.refs == 0 {
		return errors.New("the peer session is closed")
	}
	a.refs++
	return nil
}

// release drops a reference taken by acquire or use.
func (c *peerMaps) release(a *peerAlloc) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropLocked(a)
}

func (c *peerMaps) dropLocked(a *peerAlloc) error {
	a.refs--
	if a.refs > 0 {
		return nil
	}
	delete(c.allocs, a.key)
	c.open.Add(-1)
	if err := a.m.Close(); err != nil {
		return fmt.Errorf("close imported allocation %s: %w", a.key, err)
	}
	return nil
}

// revoke drops region id's reference (the exporter unregistered it).
func (c *peerMaps) revoke(id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.regions[id]
	if a == nil {
		return nil
	}
	delete(c.regions, id)
	return c.dropLocked(a)
}

// closeAll drops every region's reference and refuses new imports; copies
// still running keep their allocations until they release them.
func (c *peerMaps) closeAll() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for id, a := range c.regions {
		delete(c.regions, id)
		errs = append(errs, c.dropLocked(a))
	}
	return errors.Join(errs...)
}
