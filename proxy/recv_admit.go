// Admitting a peer's push: its Announce checked against the regions it
// may write, then opened in the session's receive core (recv_xfer.go),
// before any of its chunks lands.

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

// acceptPush answers a peer's Announce on the control session.
func (s *Server) acceptPush(ss *session, m *wire.Announce) {
	if err := s.admitPush(ss, m, nil); err != nil {
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
// enough for what the transfer writes. ackOn is the data stream of an
// inline Announce (its chunk is acked there); nil on the control session.
func (s *Server) admitPush(ss *session, m *wire.Announce, ackOn *dataStream) error {
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
	x := &inXfer{s: s, ss: ss, wireID: m.Transfer, tag: m.Tag, regions: regions, total: m.Total,
		end: peerPush{}, timeout: s.incomingTimeout(), ackOn: ackOn}
	x.dest = bytesInto(x)
	return s.admitIn(ss, x)
}

// admitIn registers a peer's push x, checked, on its session: refused
// (its regions released) when the id is in use or was, the session
// closed, or the peer has limits.max_transfers_per_peer pushes running.
func (s *Server) admitIn(ss *session, x *inXfer) error {
	err := ss.in.open(x)
	if err != nil {
		region.ReleaseAll(x.regions)
		x.use.end()
	}
	return err
}

// refusePush tells the peer why its push was refused. Chunks of the
// transfer already on their way are drained (the core buries its id),
// except for a duplicate id: the first transfer with it goes on.
func (s *Server) refusePush(ss *session, id uint64, err error) {
	if err == errSessionGone {
		return
	}
	if errCode(err) != wire.CodeExists {
		s.log.Warn("refused push", zap.String("peer", ss.peerName), zap.Uint64("transfer", id), zap.Error(err))
	}
	ss.in.recv(staging.RecvEvent{Kind: staging.RxRefused, Transfer: id, Err: err}, nil)
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

// acceptKVPush answers a peer's KVAnnounce; one whose grant has not come
// yet waits for it (kvpark.go).
func (s *Server) acceptKVPush(ss *session, m *wire.KVAnnounce) {
	ks, err := s.kv.admit(ss, &m.KVRequest, wire.AccessRemoteWrite)
	if errors.Is(err, grant.ErrNoGrant) && s.parkKVPush(ss, m) {
		return
	}
	s.openKVPush(ss, m, ks, err)
}

// openKVPush opens a peer's KV push admitted as ks, or refuses it with
// err (from the admission, when not nil).
func (s *Server) openKVPush(ss *session, m *wire.KVAnnounce, ks *kvSide, err error) {
	if err == nil {
		x := &inXfer{s: s, ss: ss, wireID: m.Transfer, tag: m.Tag, regions: ks.regions, total: m.Total,
			dest: kvDest{ks.side, ks.regions, m.Total}, end: peerPush{newKVNote(&m.KVRequest)}, timeout: s.incomingTimeout(), use: ks.use}
		if err = s.admitIn(ss, x); err == nil {
			ks.use.arm(func(why error) { x.fail(why, true) }) // a revoke refuses its later chunks
		}
	}
	if err != nil {
		s.refusePush(ss, m.Transfer, err)
		return
	}
	ss.send(&wire.Accept{Transfer: m.Transfer})
}
