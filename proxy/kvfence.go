// Fencing a revoked grant (PROTOCOL.md 9.20). An engine revokes a
// transfer key when it hands the blocks back to its allocator: a receive
// that ended (landed, failed, timed out) or a hold whose pulls were
// served. A peer's transfer admitted under the key before that may still
// be moving rows: a push whose chunks wait for a data stream, a pull whose
// gathers are queued. Had RevokeGrant answered at once, such a push
// would write the blocks after the engine gave them to another request
// (or recomputed them), and such a pull would read them after. So each
// admission under a key is a use of it, and RevokeGrant stops the uses
// (their later chunks are refused; the peer hears why), waits until each
// let go of the cache's regions (a scatter or gather under way ends
// first), and only then answers.

package proxy

import (
	"sync"
	"time"

	"github.com/stage-kv/stage/wire"
)

// revokeFence bounds how long RevokeGrant waits for stopped transfers to
// let go: a scatter or gather under way, milliseconds.
const revokeFence = 5 * time.Second

// grantUse is one peer transfer admitted under a transfer key. A nil use
// (a request that needed no key) does nothing.
type grantUse struct {
	key  string
	t    *kvTable
	live uses          // its cache's live uses, which end takes it out of
	done chan struct{} // closed once the transfer let go of the cache's regions
	once sync.Once

	mu      sync.Mutex
	stop    func(error) // ends the transfer early; set once it is open (arm)
	stopped error       // the revoke's reason, once halted
}

// uses is a cache's live uses (under kvTable.mu): the transfers under way,
// a handful, so a revoke looks through them all for its key.
type uses map[*grantUse]struct{}

// addUseLocked records a use of key on c (t.mu held).
func (t *kvTable) addUseLocked(c *kvCache, key []byte) *grantUse {
	u := &grantUse{key: string(key), t: t, live: c.uses, done: make(chan struct{})}
	c.uses[u] = struct{}{}
	return u
}

// takeUsesLocked removes and returns the uses of key on c (t.mu held).
func (c *kvCache) takeUsesLocked(key []byte) []*grantUse {
	var out []*grantUse
	for u := range c.uses {
		if u.key == string(key) {
			delete(c.uses, u)
			out = append(out, u)
		}
	}
	return out
}

// arm gives the use the way to end its transfer early; a use revoked
// before its transfer opened ends it at once.
func (u *grantUse) arm(stop func(error)) {
	if u == nil {
		return
	}
	u.mu.Lock()
	err := u.stopped
	if err == nil {
		u.stop = stop
	}
	u.mu.Unlock()
	if err != nil {
		stop(err)
	}
}

// halt ends the use's transfer with err (once).
func (u *grantUse) halt(err error) {
	u.mu.Lock()
	if u.stopped != nil {
		u.mu.Unlock()
		return
	}
	u.stopped = err
	stop := u.stop
	u.mu.Unlock()
	if stop != nil {
		stop(err)
	}
}

// end records that the transfer let go of the cache's regions.
func (u *grantUse) end() {
	if u == nil {
		return
	}
	u.once.Do(func() {
		u.t.mu.Lock()
		delete(u.live, u)
		u.t.mu.Unlock()
		close(u.done)
	})
}

// fence stops every use in us with a revoke's error and waits until each
// ended, at most revokeFence; the error says how many did not.
func fence(cache string, us []*grantUse) error {
	if len(us) == 0 {
		return nil
	}
	why := codeErr(wire.CodeAccessDenied, "the engine revoked the transfer key of this transfer on KV cache %q (its blocks went back to it)", cache)
	for _, u := range us {
		u.halt(why)
	}
	timer := time.NewTimer(revokeFence)
	defer timer.Stop()
	left := len(us)
	for _, u := range us {
		select {
		case <-u.done:
			left--
		case <-timer.C:
			return codeErr(wire.CodeTimeout, "grant on KV cache %q revoked, but %d of the %d peer transfers admitted under it still hold its blocks after %v; do not reuse those blocks yet", cache, left, len(us), revokeFence)
		}
	}
	return nil
}
