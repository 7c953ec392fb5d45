package proxy

import (
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/node"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// Starting a transfer on its way: on a same-node path when the route and
// the peer allow it (proxy/node), else (or when that path cannot start)
// over TCP, a push through the sender core, a pull with a PullRequest.

// startPush announces and moves our push, the engine's transfer lx.
func (ox *outXfer) startPush(lx *localXfer, r *route, remote []string, announce *node.Announcer) {
	ss := ox.ss
	s := ss.s
	tcp := func() {
		plan, err := ox.getPlan()
		if err != nil {
			ss.node.Unwatch(ox.wireID)
			ss.out.forget(ox.wireID, corePush(ox.key))
			s.outs.take(ox.key)
			region.ReleaseAll(ox.regions)
			s.finishLocal(lx, err)
			return
		}
		// The core hears of the transfer before the peer does (a
		// same-node attempt that fell back announced it already).
		s.sender.post(staging.Event{Kind: staging.EvSubmit, Session: ss.id, Transfer: ox.key, Plan: plan, Timeout: ox.timeout, Now: time.Now()})
		announce.ViaControl()
	}
	px := &node.Push{ID: ox.wireID, Tag: ox.tag, Regions: remote, Ops: ox.ops, Total: lx.total, Plan: ox.getPlan, Announce: announce}
	run := func(t node.Transport) error { return ss.node.Push(px, t) }
	finish := func(t node.Transport, err error) { ox.finishDirect(lx, t, err) }
	ss.node.Start(r.Conf().Transport, wire.Push, run, finish, tcp)
}

// finishDirect ends a push, the engine's transfer lx, that moved (or
// failed) on a same-node path.
func (ox *outXfer) finishDirect(lx *localXfer, t node.Transport, err error) {
	ss := ox.ss
	s := ss.s
	if err != nil {
		// A refusal or a cancel says more in its Nack than in what the
		// node socket answered.
		wait := time.Duration(0)
		if c := errCode(err); c == wire.CodeUnknownTransfer {
			wait = node.NackWait
		}
		if nerr := ss.node.WaitNack(ox.wireID, wait); nerr != nil {
			err = nerr
		} else if c := errCode(err); c != wire.CodePeerUnavailable {
			ss.send(&wire.Nack{Transfer: ox.wireID, Code: c, Message: err.Error()})
		}
	}
	ss.node.Unwatch(ox.wireID)
	ss.out.forget(ox.wireID, corePush(ox.key))
	s.outs.take(ox.key)
	region.ReleaseAll(ox.regions)
	if err == nil {
		lx.addDone(lx.total)
		ss.link.BytesOut.Add(lx.total)
		ss.link.countDirect(t)
	}
	s.finishLocal(lx, err)
}

// startPull moves our pull, its incoming transfer x registered.
func (x *inXfer) startPull(r *route, m *wire.Submit, req *wire.PullRequest) {
	ss := x.ss
	s := ss.s
	tcp := func() { ss.send(req) }
	px := &node.Pull{ID: x.wireID, Tag: x.tag, Regions: m.RemoteNames, Ops: m.Ops, Local: x.regions, Total: x.total, Touch: x.touch}
	run := func(node.Transport) error { return ss.node.Pull(px) }
	finish := func(t node.Transport, err error) {
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
	ss.node.Start(r.Conf().Transport, wire.Pull, run, finish, tcp)
}
