package proxy

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// announcer sends a push's Announce once: on the control session, or, for
// an ipc push, on the node connection right before the handle request, so
// the peer admits the push and answers the request in one wake-up instead
// of waiting for the Announce to come through its control loop.
type announcer struct {
	once sync.Once
	ss   *session
	m    *wire.Announce
}

// viaControl sends the Announce on the control session unless it went out.
func (a *announcer) viaControl() { a.once.Do(func() { a.ss.send(a.m) }) }

// viaNode sends the Announce on nc unless it went out. If nc fails, the
// Announce goes on the control session instead: the transfer then falls
// back to TCP, which needs it.
func (a *announcer) viaNode(nc *nodeConn) {
	a.once.Do(func() {
		if err := unixsock.WriteFrame(nc.c, a.m, -1); err != nil {
			a.ss.send(a.m)
		}
	})
}

// startPush announces and moves a push: on a same-node path when the route
// and the peer allow it, else (or when that path cannot start) through the
// sender core over TCP.
func (s *Server) startPush(r *route, ox *outXfer, remote []string, announce *announcer) {
	ss := ox.ss
	tcp := func() {
		plan, err := ox.getPlan()
		if err != nil {
			ss.node.unwatch(ox.wireID)
			s.mu.Lock()
			delete(s.outs, ox.key)
			s.mu.Unlock()
			region.ReleaseAll(ox.regions)
			s.finishLocal(ox.local, err)
			return
		}
		// The core hears of the transfer before the peer does (a
		// same-node attempt that fell back announced it already).
		s.mbox.post(staging.Event{Kind: staging.EvSubmit, Session: ss.id, Transfer: ox.key, Plan: plan, Timeout: ox.timeout, Now: time.Now()})
		announce.viaControl()
	}
	run := func(t transport) error {
		ss.node.watchNacks(ox.wireID)
		if t == viaShm {
			announce.viaControl()
			return s.shmPush(ox)
		}
		return s.ipcPush(ox, remote, announce)
	}
	finish := func(t transport, err error) { s.finishDirectPush(ox, t, err) }
	s.direct(r, ss, wire.Push, run, finish, tcp)
}

// finishDirectPush ends a push that moved (or failed) on a same-node path.
func (s *Server) finishDirectPush(ox *outXfer, t transport, err error) {
	ss := ox.ss
	if err != nil {
		// A refusal or a cancel says more in its Nack than in what the
		// node socket answered.
		wait := time.Duration(0)
		if c := errCode(err); c == wire.CodeUnknownTransfer {
			wait = nackWait
		}
		if nerr := ss.node.waitNack(ox.wireID, wait); nerr != nil {
			err = nerr
		} else if c := errCode(err); c != wire.CodePeerUnavailable {
			ss.send(&wire.Nack{Transfer: ox.wireID, Code: c, Message: err.Error()})
		}
	}
	ss.node.unwatch(ox.wireID)
	s.mu.Lock()
	delete(s.outs, ox.key)
	s.mu.Unlock()
	region.ReleaseAll(ox.regions)
	if err == nil {
		ox.local.addDone(ox.local.total)
		ss.link.BytesOut.Add(ox.local.total)
		ss.link.countDirect(t)
	}
	s.finishLocal(ox.local, err)
}

// startPull moves a pull whose incoming transfer x is registered: on a
// same-node path when possible, else with a PullRequest over TCP.
func (s *Server) startPull(r *route, x *inXfer, m *wire.Submit, req *wire.PullRequest) {
	ss := x.ss
	tcp := func() { ss.send(req) }
	run := func(t transport) error { return s.ipcPull(x, m) }
	finish := func(t transport, err error) {
		if err == nil {
			if err = x.directLanded(x.total); err == nil {
				ss.link.BytesIn.Add(x.total)
				ss.link.countDirect(t)
				return
			}
		}
		x.fail(err, false)
		if errCode(err) == wire.CodeInternal {
			s.log.Warn("direct pull failed", zap.String("peer", ss.peerName), zap.Error(err))
		}
	}
	s.direct(r, ss, wire.Pull, run, finish, tcp)
}
