// Package grant is the pure core of KV grants (PROTOCOL.md 9.20): which
// transfer key may read or write which blocks of one KV cache, until
// when, and how many more times. It does no I/O and reads no clock: the
// caller passes the time. A Set is one cache's; it is not safe for
// concurrent use (the sidecar holds it under its KV table's lock).
//
// Use it where a peer's request must prove the engine meant it; do not use
// it for anything the engine does itself (its own SubmitKV needs none).
package grant

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Errors of Use, each wrapped with what was asked.
var (
	ErrNoGrant = errors.New("no live grant") // unknown key, ended, expired or revoked
	ErrBlocks  = errors.New("the grant covers other blocks")
	ErrAccess  = errors.New("the grant is for the other direction")
	ErrFull    = errors.New("too many live grants")
)

// Grant is what the engine allowed.
type Grant struct {
	Write   bool
	Blocks  []uint32
	Expires time.Time
	Uses    int // read: admitted pulls left; write: 0 (until revoked or expired)
}

// Set is one KV cache's live grants and whether the cache is guarded
// (every peer request needs a grant).
type Set struct {
	max     int
	guarded bool
	live    map[string]*Grant
}

// NewSet makes an empty set that holds at most max live grants.
func NewSet(max int) *Set { return &Set{max: max, live: map[string]*Grant{}} }

// Guarded reports whether peer requests need a grant: once the engine
// made one, they do until the set goes.
func (s *Set) Guarded() bool { return s.guarded }

// Guard makes every peer request need a grant (security.require_grants).
func (s *Set) Guard() { s.guarded = true }

// Len is the number of grants held (expired ones included until swept).
func (s *Set) Len() int { return len(s.live) }

// Add records a grant (replacing one of the same key) and guards the
// cache. A grant with no blocks only guards. Expired grants are swept
// first when the set is full; ErrFull when it still is.
func (s *Set) Add(key []byte, g Grant, now time.Time) error {
	s.guarded = true
	if len(g.Blocks) == 0 {
		return nil
	}
	k := string(key)
	if _, ok := s.live[k]; !ok && len(s.live) >= s.max {
		s.Sweep(now)
		if len(s.live) >= s.max {
			return fmt.Errorf("%w: %d on this cache; revoke those whose blocks were freed", ErrFull, len(s.live))
		}
	}
	g.Blocks = slices.Clone(g.Blocks)
	s.live[k] = &g
	return nil
}

// Revoke ends the grant key; false when there was none.
func (s *Set) Revoke(key []byte) bool {
	_, ok := s.live[string(key)]
	delete(s.live, string(key))
	return ok
}

// Sweep drops the grants expired at now.
func (s *Set) Sweep(now time.Time) {
	for k, g := range s.live {
		if !now.Before(g.Expires) {
			delete(s.live, k)
		}
	}
}

// Use admits a peer request: nil when the set is not guarded, else the
// live grant of key must be of the request's direction and cover exactly
// its block table. An admitted read takes one use; the grant ends with its
// last. Every refusal says why without saying whether the key exists
// elsewhere.
func (s *Set) Use(key []byte, write bool, blocks []uint32, now time.Time) error {
	if !s.guarded && len(key) == 0 {
		return nil
	}
	g, ok := s.live[string(key)]
	if !ok || len(key) == 0 {
		return ErrNoGrant
	}
	if !now.Before(g.Expires) {
		delete(s.live, string(key))
		return ErrNoGrant
	}
	if g.Write != write {
		return ErrAccess
	}
	if !sameBlocks(g.Blocks, blocks) {
		return ErrBlocks
	}
	if !write {
		g.Uses--
		if g.Uses <= 0 {
			delete(s.live, string(key))
		}
	}
	return nil
}

// sameBlocks compares block tables in constant time for equal lengths.
func sameBlocks(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	var diff uint32
	for i := range a {
		diff |= a[i] ^ b[i]
	}
	return subtle.ConstantTimeEq(int32(diff>>16), 0)&subtle.ConstantTimeEq(int32(diff&0xffff), 0) == 1
}
