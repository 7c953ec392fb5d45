package proxy

import (
	"context"
	"errors"
	"sync"

	"github.com/stage-kv/stage/proxy/engine"
	"github.com/stage-kv/stage/proxy/node"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/proxy/routing"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// A Submit sent in pieces (PROTOCOL.md 9.5b). The head is admitted as a
// Submit of its first ops, and its declared Total and Ends are checked
// against them. A push over TCP starts at once: the Announce carries the
// declared Total and Ends, the sender core gets a growing plan
// (staging.NewGrowingPlan) and starts the chunks the ops given so far
// cover; each later piece is checked (regions, bounds, the declared Ends
// and Total) and handed to the core (EvGrow). Anything else (a pull, a
// push that may take a same-node path) collects its pieces and starts
// whole at End, checked again whole.

// piecedXfer is the Grower of one transfer sent in pieces.
type piecedXfer struct {
	h     engineHost
	group string
	head  *wire.SubmitHead
	sub   *submitted
	ox    *outXfer // a push streaming through the core; nil: collecting

	mu    sync.Mutex
	have  uint64 // bytes of the ops given so far
	ended bool   // End came, or it failed: takes nothing more
}

// SubmitHead admits the first piece of a transfer sent in pieces.
func (h engineHost) SubmitHead(o engine.Owner, m *wire.SubmitHead, wait bool) (engine.Transfer, engine.Grower, error) {
	px, err := h.submitHead(h.s.ctx, o.Group, m, wait)
	if errors.Is(err, routing.ErrNoSession) {
		return nil, nil, engine.ErrWouldWait
	}
	if err != nil {
		return nil, nil, err
	}
	return engineTransfer{px.sub.lx}, px, nil
}

func (h engineHost) submitHead(ctx context.Context, group string, m *wire.SubmitHead, wait bool) (*piecedXfer, error) {
	have, err := declared(m, 0, m.Ops)
	if err != nil {
		return nil, err
	}
	sub, err := h.admit(ctx, group, &m.Submit, wait)
	if err != nil {
		return nil, err
	}
	px := &piecedXfer{h: h, group: group, head: m, sub: sub, have: have}
	sub.lx.total = m.Total
	if m.Dir == wire.Push && (sub.r.Conf().Transport == "tcp" || !sub.lx.ss.sameHost()) {
		px.stream()
	} else {
		sub.lx.collecting.Store(true)
	}
	return px, nil
}

// declared checks a piece's ops against what the head declared: none
// reaches past its remote region's End, and with the have bytes of the
// pieces before, they add up to at most Total. It returns the new sum.
// The decoder checked each op's indices (a head's) and that no offset +
// length overflows.
func declared(m *wire.SubmitHead, have uint64, ops []wire.LocalOp) (uint64, error) {
	for i := range ops {
		op := &ops[i]
		if uint64(op.Remote) >= uint64(len(m.Ends)) {
			return 0, codeErr(wire.CodeBadRequest, "op %d of a piece names remote region #%d of %d", i, op.Remote, len(m.Ends))
		}
		if end := m.Ends[op.Remote]; op.Len > end || op.RemoteOff > end-op.Len {
			return 0, codeErr(wire.CodeOutOfRange, "op %d of a piece reaches past offset %d of remote region %q, the end its SubmitHead declared (Ends[%d]): offset %d, length %d",
				i, end, m.RemoteNames[op.Remote], op.Remote, op.RemoteOff, op.Len)
		}
		if op.Len > m.Total-have {
			return 0, codeErr(wire.CodeOutOfRange, "the pieces' ops add up to more than the %d bytes the SubmitHead declared (Total)", m.Total)
		}
		have += op.Len
	}
	return have, nil
}

// stream starts the push through the sender core with the ops of the head.
func (px *piecedXfer) stream() {
	s, m, sub := px.h.s, px.head, px.sub
	lx := sub.lx
	ss := lx.ss
	ox := &outXfer{key: staging.Key(lx.id), wireID: lx.wireID, ss: ss, checksum: sub.checksum, end: ourPush{lx}, regions: sub.regions,
		ops: sub.chk.Plan, chunk: ss.chunkSize, growTotal: m.Total, timeout: lx.timeout, tag: m.Tag}
	px.ox = ox
	s.outs.put(ox)
	ss.out.expect(lx.wireID, corePush(ox.key))
	lx.setState(wire.StateRunning)
	ox.pushTCP(lx, node.NewAnnouncer(ss.send, &wire.Announce{Transfer: lx.wireID, Tag: m.Tag, Total: m.Total, Regions: m.RemoteNames, Ends: m.Ends}))
}

// Grow checks the next piece and hands it on: to the sender core, or to
// the ops collected for End.
func (px *piecedXfer) Grow(ops []wire.LocalOp, end bool) error {
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.ended || px.endedHere() {
		return px.failed()
	}
	have, err := declared(px.head, px.have, ops)
	var chk *region.Checked
	if err == nil {
		chk, err = region.CheckOps(&wire.Submit{LocalNames: px.head.LocalNames, RemoteNames: px.head.RemoteNames, Ops: ops}, px.sub.regions, px.ox != nil)
	}
	if err == nil && end && have != px.head.Total {
		err = codeErr(wire.CodeBadRequest, "the pieces' ops add up to %d bytes, but the SubmitHead declared %d (Total)", have, px.head.Total)
	}
	if err != nil {
		px.abortLocked(err)
		return err
	}
	px.have = have
	if px.ox != nil {
		px.h.s.sender.post(staging.Event{Kind: staging.EvGrow, Transfer: px.ox.key, Ops: chk.Plan})
	} else {
		px.sub.m.Ops = append(px.sub.m.Ops, ops...)
	}
	if end {
		px.ended = true
		if px.ox == nil {
			px.startWhole()
		}
	}
	return nil
}

// endedHere reports whether a collected transfer was ended while it
// collected (cancelled, its engine's connection gone, shutdown), and then
// lets go of its regions.
func (px *piecedXfer) endedHere() bool {
	if px.ox != nil || px.sub.lx.status(0).State != wire.StateFailed {
		return false
	}
	px.ended = true
	region.ReleaseAll(px.sub.regions)
	return true
}

// startWhole starts a collected transfer at its End, checked whole: its
// regions must still be the ones its head named (none unregistered or
// registered anew meanwhile), and its ops within them.
func (px *piecedXfer) startWhole() {
	sub := px.sub
	want := wire.AccessLocalRead
	if sub.m.Dir == wire.Pull {
		want = wire.AccessLocalWrite
	}
	again, err := px.h.s.regions.AcquireOwn(px.group, sub.m.LocalNames, want)
	if err == nil {
		for i, r := range again {
			if r != sub.regions[i] {
				err = codeErr(wire.CodeUnknownRegion, "region %q was registered anew while the transfer's pieces came: submit it again", r.Name)
				break
			}
		}
		region.ReleaseAll(again)
	}
	var chk *region.Checked
	if err == nil {
		chk, err = region.CheckOps(sub.m, sub.regions, sub.m.Dir == wire.Push)
	}
	if err != nil {
		px.fail(err)
		return
	}
	sub.chk = chk
	sub.lx.collecting.Store(false)
	if sub.m.Dir == wire.Push {
		px.h.push(sub)
	} else {
		px.h.pull(sub)
	}
}

// Abort fails the transfer: the rest of its pieces will not come.
func (px *piecedXfer) Abort(err error) {
	px.mu.Lock()
	defer px.mu.Unlock()
	if !px.ended && !px.endedHere() {
		px.abortLocked(err)
	}
}

func (px *piecedXfer) abortLocked(err error) {
	px.ended = true
	if px.ox != nil {
		// The core fails it; its end Nacks the peer and answers the engine.
		px.h.s.sender.post(staging.Event{Kind: staging.EvGrow, Transfer: px.ox.key, Err: err})
		return
	}
	px.fail(err)
}

// fail ends a collected transfer that never started.
func (px *piecedXfer) fail(err error) {
	px.ended = true
	px.sub.lx.collecting.Store(false)
	region.ReleaseAll(px.sub.regions)
	px.h.s.finishLocal(px.sub.lx, err)
}

// failed is the error of a transfer that takes nothing more.
func (px *piecedXfer) failed() error {
	if st := px.sub.lx.status(0); st.State == wire.StateFailed {
		return codeErr(st.Code, "%s", st.Message)
	}
	return codeErr(wire.CodeBadRequest, "the transfer's End came already")
}
