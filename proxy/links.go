// Links: the figures of each route, and of all peers that dialed us
// together, that stats and metrics report.

package proxy

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/stage-kv/stage/proxy/node"
)

// counters are the figures of one link (a route, or a peer that dialed us).
type counters struct {
	BytesOut, BytesIn, ChunksOut, ChunksIn atomic.Uint64
	XfersOK, XfersFailed, XfersInline      atomic.Uint64
	XfersIPC, XfersShm                     atomic.Uint64 // moved on a same-node path
	// Recovery: data streams redialed after a loss, chunks sent again at
	// the peer's request, chunks that arrived here damaged, second copies
	// of chunks that had landed here already.
	Redials, Resends, ChecksumErrors, Duplicates atomic.Uint64
	fbMu                                         sync.Mutex
	fallbacks                                    map[string]uint64 // same-node path unavailable, by reason
}

// addFallback counts a transfer that could not use a same-node path.
func (c *counters) addFallback(reason string) {
	c.fbMu.Lock()
	if c.fallbacks == nil {
		c.fallbacks = map[string]uint64{}
	}
	c.fallbacks[reason]++
	c.fbMu.Unlock()
}

// fallbackCounts copies the fallback counts (nil when none).
func (c *counters) fallbackCounts() map[string]uint64 {
	c.fbMu.Lock()
	defer c.fbMu.Unlock()
	if len(c.fallbacks) == 0 {
		return nil
	}
	return maps.Clone(c.fallbacks)
}

// countDirect counts a transfer that moved on a same-node path.
func (c *counters) countDirect(t node.Transport) {
	switch t {
	case node.IPC:
		c.XfersIPC.Add(1)
	case node.Shm:
		c.XfersShm.Add(1)
	}
}

// linkTable holds the links by name; a link, once made, lives as long as
// the sidecar, so its counters survive its sessions.
type linkTable struct {
	mu     sync.Mutex
	byName map[string]*counters
}

func newLinkTable() linkTable { return linkTable{byName: map[string]*counters{}} }

// get is the link of name, made on first use.
func (t *linkTable) get(name string) *counters {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.byName[name]
	if c == nil {
		c = &counters{}
		t.byName[name] = c
	}
	return c
}

// each calls f for every link, in no order, with the table's lock held:
// f must not take it.
func (t *linkTable) each(f func(name string, c *counters)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name, c := range t.byName {
		f(name, c)
	}
}
