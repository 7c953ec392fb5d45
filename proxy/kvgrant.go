// Grants on KV caches (PROTOCOL.md 9.20): the engine's Grant and
// RevokeGrant, and the check of a peer's KVPull or KVAnnounce against
// them. The table of each cache is a grant.Set (the pure core), kept in
// the cache, so it goes with the cache (unregistered, or its connection
// closed); this file performs: locking, the clock, wire codes.

package proxy

import (
	"time"

	"github.com/stage-kv/stage/proxy/grant"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/wire"
)

// newGrants is a new cache's grant set: guarded from the start when the
// sidecar requires grants (security.require_grants).
func (t *kvTable) newGrants() *grant.Set {
	s := grant.NewSet(wire.MaxGrants)
	if t.requireGrants {
		s.Guard()
	}
	return s
}

// ownCache is group's KV cache name (under t.mu).
func (t *kvTable) ownCacheLocked(group, name string) (*kvCache, error) {
	c := t.caches[name]
	if c == nil || c.owner.Group != group {
		return nil, codeErr(wire.CodeUnknownRegion, "no KV cache %q of this connection's group to grant on; register it first", name)
	}
	return c, nil
}

// grant records the engine's grant m on its cache.
func (t *kvTable) grant(group string, m *wire.Grant, now time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, err := t.ownCacheLocked(group, m.Cache)
	if err != nil {
		return err
	}
	for i, b := range m.Blocks {
		if b >= c.layout.Blocks {
			return codeErr(wire.CodeOutOfRange, "grant on KV cache %q: block #%d is %d, the cache has %d", m.Cache, i, b, c.layout.Blocks)
		}
	}
	g := grant.Grant{Write: m.Write, Blocks: m.Blocks, Expires: now.Add(time.Duration(m.TTLMs) * time.Millisecond), Uses: int(m.Uses)}
	was := c.grants.Guarded()
	if err := c.grants.Add(m.Key, g, now); err != nil {
		return codeErr(wire.CodeBusy, "grant on KV cache %q: %w", m.Cache, err)
	}
	if !was {
		t.guardRegions(c)
	}
	close(t.granted) // pushes waiting for a grant look again (kvpark.go)
	t.granted = make(chan struct{})
	return nil
}

// grantSignal is closed at the next grant on any cache.
func (t *kvTable) grantSignal() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.granted
}

// guardRegions refuses peers' byte-range requests on c's regions from now
// on: a guarded cache is reached through grants only.
func (t *kvTable) guardRegions(c *kvCache) {
	for _, names := range c.layers {
		rs, err := t.regions.AcquireOwn(c.owner.Group, names, 0)
		if err != nil {
			continue // gone or registered anew by another group: the KV request fails on it anyway
		}
		for _, r := range rs {
			r.GuardKV()
		}
		region.ReleaseAll(rs)
	}
}

// revoke ends the engine's grant m.Key (nothing when it ended already),
// and answers once no peer transfer admitted under it can touch the
// blocks any more (kvfence.go).
func (t *kvTable) revoke(group string, m *wire.RevokeGrant) error {
	t.mu.Lock()
	c, err := t.ownCacheLocked(group, m.Cache)
	if err != nil {
		t.mu.Unlock()
		return err
	}
	c.grants.Revoke(m.Key)
	us := c.takeUsesLocked(m.Key)
	t.mu.Unlock()
	return fence(m.Cache, us)
}

// useGrant admits a peer's request on cache c by its grant; a request
// that named a key takes a use of it (kvfence.go), nil otherwise.
func (t *kvTable) useGrant(c *kvCache, m *wire.KVRequest, write bool, now time.Time) (*grantUse, error) {
	t.mu.Lock()
	err := c.grants.Use(m.Key, write, m.Blocks, now)
	var use *grantUse
	if err == nil && len(m.Key) > 0 {
		use = t.addUseLocked(c, m.Key)
	}
	t.mu.Unlock()
	if err != nil {
		what := "pull from"
		if write {
			what = "push into"
		}
		return nil, codeErr(wire.CodeAccessDenied, "%s KV cache %q refused: %w (a peer's request must name a transfer key its engine granted for exactly these %d blocks)", what, m.Name, err, len(m.Blocks))
	}
	return use, nil
}
