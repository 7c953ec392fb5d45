package proxy

import (
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/node"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// Starting a transfer on its way: proxy/node picks the transport
// (node.Peer.Choose) and counts a fallback; a same-node path runs here on
// a goroutine of the server's, and anything else, or a same-node path that
// could not start, goes over TCP: a push through the sender core, a pull
// with a PullRequest.

// startPush announces and moves our push, the engine's transfer lx: on
// the transport its session's same-node peer state picks (node.Peer.Choose),
// over TCP (pushTCP) when that is TCP or the same-node path could not start.
func (ox *outXfer) startPush(lx *localXfer, r *route, remote []string, announce *node.Announcer) {
	ss := ox.ss
	t, fallback := ss.node.Choose(r.Conf().Transport, wire.Push)
	ss.node.NoteFallback(fallback)
	if t == node.TCP {
		ox.pushTCP(lx, announce)
		return
	}
	px := &node.Push{ID: ox.wireID, Tag: ox.tag, Regions: remote, Ops: ox.ops, Total: lx.total, Plan: ox.getPlan, Announce: announce, Submitted: lx.started}
	px.Spawned = time.Now()
	ss.s.wg.Go(func() { ox.pushDirect(lx, px, t) })
}

// pushTCP hands our push to the sender core and announces it on the
// control session: from here the core's loop moves it (send_loop.go).
func (ox *outXfer) pushTCP(lx *localXfer, announce *node.Announcer) {
	ss := ox.ss
	s := ss.s
	plan, err := ox.getPlan()
	if err != nil {
		ss.node.Unwatch(ox.wireID)
		ss.out.forget(ox.wireID, corePush(ox.key))
		s.outs.take(ox.key)
		region.ReleaseAll(ox.regions)
		s.finishLocal(lx, err)
		return
	}
	// The core hears of the transfer before the peer does (a same-node
	// attempt that fell back announced it already).
	s.sender.post(staging.Event{Kind: staging.EvSubmit, Session: ss.id, Transfer: ox.key, Plan: plan, Timeout: ox.timeout, Now: time.Now()})
	announce.ViaControl()
}

// pushDirect runs our push on same-node transport t (its own goroutine):
// one that could not start goes over TCP, untouched so far.
func (ox *outXfer) pushDirect(lx *localXfer, px *node.Push, t node.Transport) {
	err := ox.ss.node.Push(px, t)
	if ox.ss.node.NoteFallback(err) {
		ox.pushTCP(lx, px.Announce)
		return
	}
	ox.finishDirect(lx, t, err)
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

// startPull moves our pull, its incoming transfer x registered: on the
// transport node.Peer.Choose picks, else (or when the same-node path could
// not start) with a PullRequest over TCP.
func (x *inXfer) startPull(r *route, m *wire.Submit, req *wire.PullRequest) {
	ss := x.ss
	t, fallback := ss.node.Choose(r.Conf().Transport, wire.Pull)
	ss.node.NoteFallback(fallback)
	if t == node.TCP {
		ss.send(req)
		return
	}
	px := &node.Pull{ID: x.wireID, Tag: x.tag, Regions: m.RemoteNames, Ops: m.Ops, Local: x.regions, Total: x.total, Touch: x.touch}
	ss.s.wg.Go(func() { x.pullDirect(px, t, req) })
}

// pullDirect runs our pull on same-node transport t (its own goroutine):
// one that could not start goes over TCP.
func (x *inXfer) pullDirect(px *node.Pull, t node.Transport, req *wire.PullRequest) {
	ss := x.ss
	err := ss.node.Pull(px)
	if ss.node.NoteFallback(err) {
		ss.send(req)
		return
	}
	if err == nil {
		if err = x.directLanded(x.total); err == nil {
			ss.link.BytesIn.Add(x.total)
			ss.link.countDirect(t)
			return
		}
	}
	x.fail(err, false)
	if errCode(err) == wire.CodeInternal {
		ss.s.log.Warn("direct pull failed", zap.String("peer", ss.peerName), zap.Error(err))
	}
}
