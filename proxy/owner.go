// Ownership: regions, KV caches and transfers belong to the control-socket
// connection that made them, and to its group (PROTOCOL.md 9.18). When a
// connection closes, what it registered goes at once (its names are free
// again) and every transfer that holds it fails; the regions stay mapped
// until those transfers let go. Notifications go to the groups owning a
// transfer's regions.

package proxy

import (
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/engine"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// Closed releases what the connection o registered: its regions and KV
// caches leave the tables, peers forget the caches' shapes, and the
// transfers holding the regions fail. At shutdown, Close does it all.
func (h engineHost) Closed(o engine.Owner) {
	s := h.s
	if s.closing.Load() {
		return
	}
	s.inboxes.releaseConn(o.Conn)
	for _, name := range s.kv.releaseConn(o.Conn) {
		for _, ss := range s.sessions.liveList() {
			ss.send(&wire.KVInfo{Name: name}) // unasked: forget its shape
		}
	}
	rs := s.regions.ReleaseConn(o.Conn)
	if len(rs) == 0 {
		return
	}
	n := s.failHolders(rs)
	s.log.Info("engine connection closed: its regions are released", zap.Int("regions", len(rs)), zap.Int("transfers_failed", n))
}

// ownerGone is the error of a transfer on r once its owner went.
func ownerGone(r *region.Region) error {
	return codeErr(wire.CodeCancelled, "region %q: the engine connection that registered it closed (the engine went away)", r.Name)
}

// holding is the first region of rs that gone holds, nil when none.
func holding(rs []*region.Region, gone map[*region.Region]bool) *region.Region {
	for _, r := range rs {
		if gone[r] {
			return r
		}
	}
	return nil
}

// failHolders fails every transfer holding one of rs: our pushes and the
// pulls we serve (by their source regions), the peers' pushes and our
// pulls (by their destinations); peers hear it by Nack. It returns how
// many it failed. A small push on the latency path holds its regions for
// one synchronous copy and ends on its own.
func (s *Server) failHolders(rs []*region.Region) int {
	gone := make(map[*region.Region]bool, len(rs))
	for _, r := range rs {
		gone[r] = true
	}
	n := 0
	for _, ox := range s.outs.all() {
		r := holding(ox.regions, gone)
		if r == nil {
			continue
		}
		err := ownerGone(r)
		switch end := ox.end.(type) {
		case ourPush:
			s.abortLocal(end.lx, err, err.Error(), false)
		default: // a pull we serve: the core fails it, its end Nacks the peer
			s.sender.post(staging.Event{Kind: staging.EvNack, Session: ox.ss.id, Transfer: ox.key, Err: err, Now: time.Now()})
		}
		n++
	}
	for _, ss := range s.sessions.liveList() {
		for _, x := range ss.in.list() {
			if r := holding(x.regions, gone); r != nil {
				x.fail(ownerGone(r), true)
				n++
			}
		}
	}
	return n
}

// notify tells the engines that subscribed, in the groups owning regions,
// about a transfer that finished here.
func (s *Server) notify(n *wire.Notify, regions []*region.Region) {
	if s.engines == nil {
		return
	}
	var groups []string
	for _, r := range regions {
		if !slices.Contains(groups, r.Owner.Group) {
			groups = append(groups, r.Owner.Group)
		}
	}
	s.engines.Notify(n, groups)
}

// own is KV cache name for an engine of group g.
func (t *kvTable) own(g, name string) (*kvCache, error) {
	c := t.get(name)
	if c == nil {
		return nil, codeErr(wire.CodeUnknownRegion, "KV cache %q is not registered here", name)
	}
	if c.owner.Group != g {
		return nil, codeErr(wire.CodeAccessDenied, "KV cache %q belongs to another engine connection; a connection may use only its own and its group's (Join, PROTOCOL.md 9.18)", name)
	}
	return c, nil
}

// releaseConn drops the KV caches the connection conn registered and
// returns their names.
func (t *kvTable) releaseConn(conn uint64) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var names []string
	for name, c := range t.caches {
		if c.owner.Conn == conn {
			delete(t.caches, name)
			names = append(names, name)
		}
	}
	return names
}

// all is a snapshot of the transfers whose chunks leave here.
func (t *outTable) all() []*outXfer {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*outXfer, 0, len(t.byKey))
	for _, ox := range t.byKey {
		out = append(out, ox)
	}
	return out
}
