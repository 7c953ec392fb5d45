// Admitting a peer's requests: its push Announces (checked against the
// regions it may write) and its pull requests (against those it may read).

package proxy

import (
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// acceptPush answers a peer's Announce on the control session.
func (s *Server) acceptPush(ss *session, m *wire.Announce) {
	if err := s.admitPush(ss, m); err != nil {
		s.refusePush(ss, m.Transfer, err)
		return
	}
	ss.send(&wire.Accept{Transfer: m.Transfer})
}

// errSessionGone: the session closed while a transfer was being admitted;
// its transfers fail through the close, nothing more to say.
var errSessionGone = errors.New("session closed")

// admitPush checks a peer's Announce and registers the incoming transfer:
// every destination region must exist, grant remote write, and be large
// enough for what the transfer writes.
func (s *Server) admitPush(ss *session, m *wire.Announce) error {
	if ss.ours(m.Transfer) {
		return codeErr(wire.CodeMalformed, "transfer id %d has our parity", m.Transfer)
	}
	if len(m.Ends) != len(m.Regions) || m.Total == 0 {
		return codeErr(wire.CodeMalformed, "announce with %d regions, %d ends, %d B", len(m.Regions), len(m.Ends), m.Total)
	}
	regions, err := s.regions.AcquireAll(m.Regions, wire.AccessRemoteWrite)
	if err != nil {
		return err
	}
	for i, r := range regions {
		if m.Ends[i] > r.Len {
			region.ReleaseAll(regions)
			return codeErr(wire.CodeOutOfRange, "transfer writes up to offset %d of region %s, which has %d B", m.Ends[i], r.Name, r.Len)
		}
	}
	x := &inXfer{s: s, ss: ss, wireID: m.Transfer, tag: m.Tag, dir: wire.Push, regions: regions, total: m.Total,
		timeout: s.incomingTimeout(), progress: time.Now()}
	return s.admitIn(ss, x)
}

// admitIn registers a peer's push x, checked, on its session: refused
// (its regions released) when the id is in use or was, the session
// closed, or the peer has limits.max_transfers_per_peer pushes running.
func (s *Server) admitIn(ss *session, x *inXfer) error {
	ss.mu.Lock()
	_, dup := ss.in[x.wireID]
	_, dead := ss.gone[x.wireID]
	dup = dup || dead
	n := len(ss.in)
	ok := !ss.closed && !dup && n < s.cfg.Limits.MaxTransfersPerPeer
	if ok {
		ss.in[x.wireID] = x
		ss.announce.Broadcast()
	}
	closed := ss.closed
	ss.mu.Unlock()
	if ok {
		return nil
	}
	region.ReleaseAll(x.regions)
	switch {
	case dup:
		return codeErr(wire.CodeExists, "transfer %d already in progress or finished", x.wireID)
	case closed:
		return errSessionGone
	}
	return codeErr(wire.CodeBusy, "limits.max_transfers_per_peer (%d) reached", s.cfg.Limits.MaxTransfersPerPeer)
}

// refusePush tells the peer why its push was refused. Chunks of the
// transfer already on their way are drained, except for a duplicate id:
// the first transfer with it goes on.
func (s *Server) refusePush(ss *session, id uint64, err error) {
	if err == errSessionGone {
		return
	}
	if errCode(err) != wire.CodeExists {
		s.log.Warn("refused push", zap.String("peer", ss.peerName), zap.Uint64("transfer", id), zap.Error(err))
		ss.mu.Lock()
		ss.buryLocked(id, false)
		ss.mu.Unlock()
	}
	ss.send(&wire.Nack{Transfer: id, Code: errCode(err), Message: err.Error()})
}

// incomingTimeout is how long a transfer a peer started (its push, a pull
// we serve it) may go without progress before we give up on it and free
// its slots and regions: the longest routes[].progress_timeout, so that we
// never give up before a peer configured like us does, or, with no route,
// limits.peer_progress_timeout.
func (s *Server) incomingTimeout() time.Duration {
	var t time.Duration
	for _, r := range s.cfg.Routes {
		t = max(t, r.ProgressTimeout)
	}
	if t == 0 {
		t = s.cfg.Limits.PeerProgressTimeout
	}
	return t
}

// refusePull tells the peer why its pull was refused.
func (s *Server) refusePull(ss *session, id uint64, err error) {
	s.log.Warn("refused pull", zap.String("peer", ss.peerName), zap.Uint64("transfer", id), zap.Error(err))
	ss.send(&wire.Nack{Transfer: id, Code: errCode(err), Message: err.Error()})
}

// servePull answers a peer's PullRequest: every source range is checked
// before anything is sent.
func (s *Server) servePull(ss *session, m *wire.PullRequest) {
	nack := func(err error) { s.refusePull(ss, m.Transfer, err) }
	if ss.ours(m.Transfer) {
		nack(codeErr(wire.CodeMalformed, "transfer id %d has our parity", m.Transfer))
		return
	}
	regions, err := s.regions.AcquireAll(m.SrcRegions, wire.AccessRemoteRead)
	if err != nil {
		nack(err)
		return
	}
	ops := make([]staging.PlanOp, len(m.Ops))
	for i, op := range m.Ops {
		if int(op.Src) >= len(regions) {
			region.ReleaseAll(regions)
			nack(codeErr(wire.CodeBadRequest, "op %d names source region #%d of %d", i, op.Src, len(regions)))
			return
		}
		if _, err := regions[op.Src].Seg(op.SrcOff, op.Len); err != nil {
			region.ReleaseAll(regions)
			nack(codeErr(wire.CodeOutOfRange, "op %d: %w", i, err))
			return
		}
		ops[i] = staging.PlanOp{Src: regions[op.Src].Addr(op.SrcOff), DstRegion: op.Dst, DstOff: op.DstOff, Len: op.Len}
	}
	plan, err := staging.NewPlan(ops, ss.chunkSize)
	if err != nil {
		region.ReleaseAll(regions)
		nack(codeErr(wire.CodeBadRequest, "%w", err))
		return
	}
	s.serveOut(ss, m.Transfer, m.Tag, regions, plan, nil)
}

// serveOut starts a pull we serve whose source ranges were checked: it
// holds regions until the core retires it.
func (s *Server) serveOut(ss *session, wireID uint64, tag string, regions []*region.Region, plan *staging.Plan, kvn *kvNote) {
	key := staging.Key(s.newID())
	ox := &outXfer{key: key, wireID: wireID, ss: ss, regions: regions, plan: plan, timeout: s.incomingTimeout(), tag: tag, kvn: kvn}
	ss.mu.Lock()
	_, dup := ss.served[wireID]
	if !dup && !ss.closed {
		ss.served[wireID] = key
	}
	closed := ss.closed
	ss.mu.Unlock()
	if dup || closed {
		region.ReleaseAll(regions)
		if dup {
			s.refusePull(ss, wireID, codeErr(wire.CodeExists, "transfer %d already in progress", wireID))
		}
		return
	}
	s.outs.put(ox)
	ss.send(&wire.Accept{Transfer: wireID})
	s.mbox.post(staging.Event{Kind: staging.EvSubmit, Session: ss.id, Transfer: key, Plan: plan, Timeout: ox.timeout, Now: time.Now()})
}
