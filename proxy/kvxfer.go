// KV transfers: the engine's SubmitKV, and the peer's KVAnnounce (a push
// into our cache) and KVPull (a pull from it). They run on the TCP path
// through the sender core like byte transfers; only the plan (the source
// side's mapping) and the receiver's resolve (its own mapping) differ.

package proxy

import (
	"context"
	"fmt"
	"time"

	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/proxy/node"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// submitKV validates and starts an engine's KV transfer. Nothing moves
// unless every check passes on this side; the peer checks its side when
// the request arrives and refuses with a Nack naming what is wrong.
func (h engineHost) submitKV(ctx context.Context, m *wire.SubmitKV) (*localXfer, error) {
	s := h.s
	r, err := h.openRoute(m.Route)
	if err != nil {
		return nil, err
	}
	c := s.kv.get(m.Local)
	if c == nil {
		return nil, codeErr(wire.CodeUnknownRegion, "KV cache %q is not registered here", m.Local)
	}
	if m.Tokens == 0 {
		return nil, codeErr(wire.CodeBadRequest, "KV transfer of 0 tokens")
	}
	remoteLayers := m.RemoteLayers
	if len(remoteLayers) == 0 {
		remoteLayers = m.Layers
	}
	if len(remoteLayers) != len(m.Layers) {
		return nil, codeErr(wire.CodeBadRequest, "%d remote layers for %d local ones", len(remoteLayers), len(m.Layers))
	}
	ss, err := r.Pick(ctx, m.Peer)
	if err != nil {
		return nil, err
	}
	peer, err := s.kv.peerShape(ctx, ss, m.Remote)
	if err != nil {
		return nil, err
	}
	peerLayout := layoutOfShape(&peer)
	headLo, headHi, cols, err := checkKV(&c.layout, &peerLayout, m.HeadLo, m.HeadHi)
	if err != nil {
		return nil, err
	}
	if err := checkPeerTable(&peer, m.RemoteBlocks, m.RemoteFirst, m.Tokens, m.Dir == wire.Push); err != nil {
		return nil, err
	}
	want := wire.AccessLocalRead
	if m.Dir == wire.Pull {
		want = wire.AccessLocalWrite
	}
	order := kvOrder(&c.layout, &peer, m.LocalFirst, m.RemoteFirst)
	side, regions, err := s.kv.side(c, m.Layers, want, m.LocalBlocks, m.LocalFirst, m.Tokens, headLo, headHi, cols, order)
	if err != nil {
		return nil, err
	}
	checksum := checksumFor(r, m.Checksum)
	// KV transfers take the TCP path, where each side maps its own
	// layout; a same-node path the route would have taken is counted as
	// a fallback.
	if t, _ := ss.node.Choose(r.Conf().Transport, m.Dir); t != node.TCP {
		ss.node.NoteFallback(node.Fallback(node.FallbackKV, fmt.Errorf("KV transfers move over TCP (same-node paths do not convert layouts)")))
	}
	total := side.Len()
	id := s.newID()
	lx := &localXfer{id: id, wireID: ss.wireID(id), route: m.Route, dir: m.Dir, tag: m.Tag, total: total, ss: ss,
		timeout: r.Conf().ProgressTimeout, state: wire.StateRunning, started: time.Now(), done: make(chan struct{})}
	req := wire.KVRequest{Transfer: lx.wireID, Tag: m.Tag, Total: total, Name: m.Remote, Layers: remoteLayers,
		Blocks: m.RemoteBlocks, First: m.RemoteFirst, Tokens: m.Tokens, HeadLo: headLo, HeadHi: headHi,
		Order: uint8(order), Shape: c.shape, PeerShape: peer}
	// A KV transfer that fails forgets the peer's shape: the next one asks
	// again, in case the peer registered its cache anew.
	lx.onDone = append(lx.onDone, func() {
		if lx.err != nil {
			s.kv.forgetPeer(ss.id, m.Remote)
		}
	})
	s.xfers.add(lx)
	if m.Dir == wire.Push {
		plan, err := kvPlan(side, regions, ss.chunkSize)
		if err != nil {
			region.ReleaseAll(regions)
			s.finishLocal(lx, err)
			return lx, nil
		}
		ox := &outXfer{key: staging.Key(id), wireID: lx.wireID, ss: ss, checksum: checksum, local: lx, regions: regions,
			chunk: ss.chunkSize, plan: plan, timeout: lx.timeout, tag: m.Tag}
		ox.planOnce.Do(func() {}) // the plan is made
		s.outs.put(ox)
		// As for byte pushes, the core hears of the transfer before the
		// peer does, and the chunks follow the announce without waiting.
		s.sender.post(staging.Event{Kind: staging.EvSubmit, Session: ss.id, Transfer: ox.key, Plan: plan, Timeout: ox.timeout, Now: time.Now()})
		ss.send(&wire.KVAnnounce{KVRequest: req})
		return lx, nil
	}
	x := &inXfer{s: s, ss: ss, wireID: lx.wireID, tag: m.Tag, dir: wire.Pull, regions: regions, total: total,
		dest: kvDest{side, regions, total}, local: lx, timeout: lx.timeout}
	if s.expectPull(x) {
		ss.send(&wire.KVPull{KVRequest: req})
	}
	return lx, nil
}

// admit checks a peer's KV request against our cache m.Name: its shape
// unchanged since the peer asked, the layouts compatible, the layers,
// block table, tokens and heads inside ours, and the total the peer
// computed equal to ours. It returns our side and its regions (acquired
// with rights want).
func (t *kvTable) admit(ss *session, m *wire.KVRequest, want wire.Access) (*kvSide, error) {
	if ss.ours(m.Transfer) {
		return nil, codeErr(wire.CodeMalformed, "transfer id %d has our parity", m.Transfer)
	}
	c := t.get(m.Name)
	if c == nil {
		return nil, codeErr(wire.CodeUnknownRegion, "no KV cache %q here", m.Name)
	}
	if !sameShape(&c.shape, &m.PeerShape) {
		return nil, codeErr(wire.CodeBadRequest, "KV cache %q was registered anew since the peer asked for its shape; retry", m.Name)
	}
	peer := layoutOfShape(&m.Shape)
	lo, hi, cols, err := checkKV(&c.layout, &peer, m.HeadLo, m.HeadHi)
	if err != nil {
		return nil, err
	}
	if lo != m.HeadLo || hi != m.HeadHi {
		return nil, codeErr(wire.CodeMalformed, "KV request names heads [%d, %d)", m.HeadLo, m.HeadHi)
	}
	// The requester's first token is not in the request; the order it
	// chose must be one our side can use: block-major needs both sides
	// head-outer and of one block size (the alignment of first tokens
	// the requester checked; a wrong claim moves rows within the blocks
	// we granted, never outside them).
	order := kvlayout.Order(m.Order)
	if order == kvlayout.BlockMajor && kvOrder(&c.layout, &m.Shape, 0, 0) != kvlayout.BlockMajor {
		return nil, codeErr(wire.CodeMalformed, "KV request asks for block-major order, which needs both sides head-outer with one block size: here %v and %d, there %v and %d",
			c.layout.HeadOuter(), c.layout.BlockSize, m.Shape.Flags&wire.KVHeadOuter != 0, m.Shape.BlockSize)
	}
	side, regions, err := t.side(c, m.Layers, want, m.Blocks, m.First, m.Tokens, lo, hi, cols, order)
	if err != nil {
		return nil, err
	}
	if side.Len() != m.Total {
		region.ReleaseAll(regions)
		return nil, codeErr(wire.CodeMalformed, "KV request says %d B; its rows make %d B here", m.Total, side.Len())
	}
	return &kvSide{side: side, regions: regions}, nil
}

// acceptKVPush answers a peer's KVAnnounce.
func (s *Server) acceptKVPush(ss *session, m *wire.KVAnnounce) {
	ks, err := s.kv.admit(ss, &m.KVRequest, wire.AccessRemoteWrite)
	if err == nil {
		x := &inXfer{s: s, ss: ss, wireID: m.Transfer, tag: m.Tag, dir: wire.Push, regions: ks.regions, total: m.Total,
			dest: kvDest{ks.side, ks.regions, m.Total}, timeout: s.incomingTimeout(), kvn: newKVNote(&m.KVRequest)}
		err = s.admitIn(ss, x)
	}
	if err != nil {
		s.refusePush(ss, m.Transfer, err)
		return
	}
	ss.send(&wire.Accept{Transfer: m.Transfer})
}

// serveKVPull answers a peer's KVPull: the rows go out in canonical order.
func (s *Server) serveKVPull(ss *session, m *wire.KVPull) {
	ks, err := s.kv.admit(ss, &m.KVRequest, wire.AccessRemoteRead)
	if err != nil {
		s.refusePull(ss, m.Transfer, err)
		return
	}
	plan, err := kvPlan(ks.side, ks.regions, ss.chunkSize)
	if err != nil {
		region.ReleaseAll(ks.regions)
		s.refusePull(ss, m.Transfer, err)
		return
	}
	s.serveOut(ss, m.Transfer, m.Tag, ks.regions, plan, newKVNote(&m.KVRequest))
}
