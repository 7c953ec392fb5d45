package proxy

import (
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/node"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// The server as the same-node room (package node) sees it: nodeHost is
// its Host, nodeSession a session's Session, nodeIn an incoming push's
// Incoming.

type nodeHost struct{ s *Server }

var _ node.Host = nodeHost{}

func (h nodeHost) Copier() *staging.Copier { return h.s.copiers.take() }
func (h nodeHost) Fallback(reason string)  { h.s.metrics.fallbacks.WithLabelValues(reason).Inc() }

func (h nodeHost) Peer(sid [wire.SessionIDSize]byte) *node.Peer {
	for _, ss := range h.s.sessions.liveList() {
		if ss.sid == sid {
			return ss.node
		}
	}
	return nil
}

type nodeSession struct{ ss *session }

var _ node.Session = nodeSession{}

func (n nodeSession) Ident() node.Ident {
	ss := n.ss
	return node.Ident{Name: ss.peerName, Link: ss.linkName, ID: ss.sid, Dialer: ss.dialer, SameHost: ss.sameHost(), ChunkSize: ss.chunkSize}
}

func (n nodeSession) Proof() [wire.ProofSize]byte {
	ss := n.ss
	return proof(ss.s.token, "stage-node", ss.sid[:], ss.nonceC[:], ss.nonceS[:])
}

func (n nodeSession) Send(m wire.Msg)             { n.ss.send(m) }
func (n nodeSession) AcceptPush(m *wire.Announce) { n.ss.s.acceptPush(n.ss, m) }
func (n nodeSession) Fallback(reason string)      { n.ss.link.addFallback(reason) }

func (n nodeSession) IncomingPush(id uint64, wait bool) node.Incoming {
	var x *inXfer
	if wait {
		x = n.ss.in.incoming(id)
	} else {
		x = n.ss.in.lookup(id)
	}
	if x == nil || x.pull() {
		return nil
	}
	return nodeIn{x}
}

func (n nodeSession) ServedPull(id uint64, tag string, bytes uint64, regions []*region.Region) {
	ss := n.ss
	ss.link.XfersOK.Add(1)
	ss.link.XfersIPC.Add(1)
	ss.link.BytesOut.Add(bytes)
	ss.s.notify(&wire.Notify{Transfer: id, Peer: ss.peerName, Route: routeName(ss), Tag: tag, Dir: wire.Pull, Bytes: bytes}, regions)
}

type nodeIn struct{ x *inXfer }

func (n nodeIn) Regions() []*region.Region     { return n.x.regions }
func (n nodeIn) Total() uint64                 { return n.x.total }
func (n nodeIn) Touch()                        { n.x.touch() }
func (n nodeIn) Fail(err error, tellPeer bool) { n.x.fail(err, tellPeer) }
func (n nodeIn) Release()                      { n.x.release() }

func (n nodeIn) ViaRing() { n.x.viaRing() }

func (n nodeIn) Resolve(ch *wire.Chunk, segs []device.Seg) ([]device.Seg, error) {
	return n.x.resolve(ch, segs)
}

// LandedDirect also counts the push on its link.
func (n nodeIn) LandedDirect(b uint64) error {
	if err := n.x.directLanded(b); err != nil {
		return err
	}
	n.x.ss.link.BytesIn.Add(b)
	n.x.ss.link.XfersIPC.Add(1)
	return nil
}

// Landed also counts the chunk's bytes on its link.
func (n nodeIn) Landed(idx uint32, b uint64, err error) {
	n.x.landed(idx, b, err)
	n.x.ss.link.BytesIn.Add(b)
}

func (ss *session) sameHost() bool { return ss.peerHost != "" && ss.peerHost == ss.s.hostID }
