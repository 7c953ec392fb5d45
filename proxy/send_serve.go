// Serving a peer's pull: its PullRequest checked against the regions it
// may read, then handed to the sender core like a push of ours.

package proxy

import (
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/grant"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

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
	s.serveOut(ss, m.Transfer, m.Tag, regions, plan, nil, nil)
}

// serveOut starts a pull we serve whose source ranges were checked: it
// holds regions until the core retires it, and then ends use (the
// transfer key it was admitted under, nil for none).
func (s *Server) serveOut(ss *session, wireID uint64, tag string, regions []*region.Region, plan *staging.Plan, kvn *kvNote, use *grantUse) {
	key := staging.Key(s.newID())
	ox := &outXfer{key: key, wireID: wireID, ss: ss, end: servedPull{kvn}, regions: regions, plan: plan, timeout: s.incomingTimeout(), tag: tag, use: use}
	if dup, closed := ss.out.serve(wireID, key); dup || closed {
		region.ReleaseAll(regions)
		use.end()
		if dup {
			s.refusePull(ss, wireID, codeErr(wire.CodeExists, "transfer %d already in progress", wireID))
		}
		return
	}
	s.outs.put(ox)
	ss.send(&wire.Accept{Transfer: wireID})
	s.sender.post(staging.Event{Kind: staging.EvSubmit, Session: ss.id, Transfer: key, Plan: plan, Timeout: ox.timeout, Now: time.Now()})
	// A revoke cancels it: the core gathers nothing more, and it retires
	// once the gathers under way ended.
	use.arm(func(error) { s.sender.post(staging.Event{Kind: staging.EvCancel, Transfer: key, Now: time.Now()}) })
}

// serveKVPull answers a peer's KVPull: the rows go out in canonical order.
// One that names a key no live grant holds yet waits for it (kvpark.go).
func (s *Server) serveKVPull(ss *session, m *wire.KVPull) {
	ks, err := s.kv.admit(ss, &m.KVRequest, wire.AccessRemoteRead)
	if errors.Is(err, grant.ErrNoGrant) && s.parkKVPull(ss, m) {
		return
	}
	s.serveKVPullAdmitted(ss, m, ks, err)
}

// serveKVPullAdmitted serves m as admit answered (ks, or why not).
func (s *Server) serveKVPullAdmitted(ss *session, m *wire.KVPull, ks *kvSide, err error) {
	if err != nil {
		s.refusePull(ss, m.Transfer, err)
		return
	}
	plan, err := kvPlan(ks.side, ks.regions, ss.chunkSize)
	if err != nil {
		region.ReleaseAll(ks.regions)
		ks.use.end()
		s.refusePull(ss, m.Transfer, err)
		return
	}
	s.serveOut(ss, m.Transfer, m.Tag, ks.regions, plan, newKVNote(&m.KVRequest), ks.use)
}
