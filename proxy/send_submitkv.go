// The engine's SubmitKV. KV transfers run on the TCP path through the
// sender core like byte transfers; only the plan (the source side's
// mapping) and the receiver's resolve (its own mapping) differ. The peer's
// KVAnnounce (a push into our cache) is admitted in recv_admit.go, its
// KVPull (a pull from it) served in send_serve.go, both checked by
// kvTable.admit (kv.go).

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
func (h engineHost) submitKV(ctx context.Context, group string, m *wire.SubmitKV) (*localXfer, error) {
	s := h.s
	r, err := h.openRoute(m.Route)
	if err != nil {
		return nil, err
	}
	c, err := s.kv.own(group, m.Local)
	if err != nil {
		return nil, err
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
	lx := &localXfer{id: id, wireID: ss.wireID(id), route: m.Route, dir: m.Dir, tag: m.Tag, total: total, ss: ss, group: group,
		timeout: r.Conf().ProgressTimeout, state: wire.StateRunning, started: time.Now(), done: make(chan struct{})}
	req := wire.KVRequest{Transfer: lx.wireID, Tag: m.Tag, Total: total, Name: m.Remote, Layers: remoteLayers,
		Blocks: m.RemoteBlocks, First: m.RemoteFirst, Tokens: m.Tokens, HeadLo: headLo, HeadHi: headHi,
		Order: uint8(order), Shape: c.shape, PeerShape: peer, Key: m.Key}
	// A KV transfer that fails forgets the peer's shape: the next one asks
	// again, in case the peer registered its cache anew.
	lx.onDone = append(lx.onDone, func() {
		if lx.err != nil {
			s.kv.forgetPeer(ss.id, m.Remote)
		}
	})
	s.xfers.add(lx)
	if m.Dir == wire.Push {
		s.startKVPush(lx, side, regions, checksum, req)
		return lx, nil
	}
	x := &inXfer{s: s, ss: ss, wireID: lx.wireID, tag: m.Tag, regions: regions, total: total,
		dest: kvDest{side, regions, total}, end: ourPull{lx}, timeout: lx.timeout}
	if s.expectPull(x) {
		ss.send(&wire.KVPull{KVRequest: req})
	}
	return lx, nil
}

// startKVPush plans a KV push (its chunks, each side's layout mapped) and
// starts it: the core hears of it before the peer does, and the chunks
// follow the announce without waiting, as for byte pushes. A push that
// cannot be planned fails here, its regions let go.
func (s *Server) startKVPush(lx *localXfer, side *kvlayout.Side, regions []*region.Region, checksum bool, req wire.KVRequest) {
	ss := lx.ss
	plan, err := kvPlan(side, regions, ss.chunkSize)
	if err != nil {
		region.ReleaseAll(regions)
		s.finishLocal(lx, err)
		return
	}
	ox := &outXfer{key: staging.Key(lx.id), wireID: lx.wireID, ss: ss, checksum: checksum, end: ourPush{lx}, regions: regions,
		chunk: ss.chunkSize, plan: plan, timeout: lx.timeout, tag: lx.tag}
	ox.planOnce.Do(func() {}) // the plan is made
	s.outs.put(ox)
	ss.out.expect(lx.wireID, corePush(ox.key))
	s.sender.post(staging.Event{Kind: staging.EvSubmit, Session: ss.id, Transfer: ox.key, Plan: plan, Timeout: ox.timeout, Now: time.Now()})
	ss.send(&wire.KVAnnounce{KVRequest: req})
}
