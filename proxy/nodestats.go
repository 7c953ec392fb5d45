package proxy

import (
	"maps"

	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/wire"
)

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
func (c *counters) countDirect(t transport) {
	switch t {
	case viaIPC:
		c.XfersIPC.Add(1)
	case viaShm:
		c.XfersShm.Add(1)
	}
}

// revokeRegion tells every same-node peer that got r's handle that r is gone.
func (s *Server) revokeRegion(r *region.Region) {
	for _, ss := range s.liveSessions() {
		ss.revoke(r.ID)
	}
}

// transportOf says what the next transfer on ss would use, for stagectl
// routes (no waiting, no counting).
func (s *Server) transportOf(want string, ss *session) string {
	if want == "tcp" || !ss.sameHost() {
		return "tcp"
	}
	select {
	case <-ss.node.info:
	default:
		return "tcp (same node; waiting for the peer's node info)"
	}
	t, err := s.choose(want, ss, wire.Push)
	if err != nil {
		return "tcp (fallback: " + err.Error() + ")"
	}
	return t.String()
}
