package proxy

import (
	"time"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// peerRegions are the peer's regions of one transfer, imported: handle i
// and its allocation (a reference held until release).
type peerRegions struct {
	n      *nodeState
	hs     []*wire.RegionHandle
	allocs []*peerAlloc
}

// addr resolves [off, off+n) of peer region i, bounds-checked against the
// region the peer described.
func (p *peerRegions) addr(i uint32, off, n uint64) (device.Addr, error) {
	if int(i) >= len(p.hs) {
		return 0, codeErr(wire.CodeBadRequest, "peer region #%d of %d", i, len(p.hs))
	}
	h := p.hs[i]
	if n == 0 || !region.InRange(off, n, h.Length) {
		return 0, codeErr(wire.CodeOutOfRange, "offset %d + length %d is past the end of the peer's region #%d (%d B)", off, n, i, h.Length)
	}
	return p.allocs[i].m.Base() + device.Addr(h.Offset+off), nil
}

func (p *peerRegions) release() {
	for _, a := range p.allocs {
		if err := p.n.maps.release(a); err != nil {
			p.n.s.log.Warn(err.Error())
		}
	}
	p.allocs = nil
}

// takeHandles asks the peer for the handles of a transfer's regions and
// imports them. Refusals (unknown region, access denied) are failures of
// the transfer; anything that keeps the path from working is a fallback.
func (s *Server) takeHandles(nc *nodeConn, ss *session, req *wire.HandleRequest, want wire.Access) (*peerRegions, error) {
	hs, fds, err := nc.handles(req)
	if err != nil {
		switch c := errCode(err); {
		case c == wire.CodeUnsupported:
			return nil, fallback(fbNotExportable, err)
		case c != wire.CodeInternal:
			return nil, err
		}
		return nil, fallback(fbPeerUnreachable, err)
	}
	defer unixsock.CloseFDs(fds) // imports keep what they need
	p := &peerRegions{n: ss.node, hs: hs}
	for i, h := range hs {
		if h.Access&want != want {
			p.release()
			return nil, codeErr(wire.CodeAccessDenied, "peer region %q does not grant %s", req.Regions[i], region.AccessString(want))
		}
		a, err := ss.node.maps.acquire(h, fds[i])
		if err != nil {
			p.release()
			return nil, fallback(fbImportFailed, err)
		}
		p.allocs = append(p.allocs, a)
	}
	return p, nil
}

// ipcPush copies a push straight into the receiver's regions and tells it.
func (s *Server) ipcPush(ox *outXfer, names []string, announce *announcer) (err error) {
	ss := ox.ss
	nc, err := ss.node.getConn(ss)
	if err != nil {
		return fallback(fbPeerUnreachable, err)
	}
	defer func() { ss.node.putConn(nc, err == nil) }()
	announce.viaNode(nc)
	p, err := s.takeHandles(nc, ss, &wire.HandleRequest{Transfer: ox.wireID, Dir: wire.Push, Tag: ox.tag, Regions: names}, wire.AccessRemoteWrite)
	if err != nil {
		return err
	}
	defer p.release()
	ps, err := opPieces(ox.ops, p)
	if err != nil {
		return err
	}
	if err := ss.node.checkNack(ox.wireID); err != nil {
		return err
	}
	if err := s.copyDirect(ps); err != nil {
		return err
	}
	return nc.call(&wire.DirectDone{Transfer: ox.wireID, Bytes: ox.local.total}, -1)
}

// opPieces turns a push's ops into copies, each destination resolved (and
// bounds-checked) in the peer's regions; adjacent ops merge.
func opPieces(ops []staging.PlanOp, p *peerRegions) ([]piece, error) {
	ps := make([]piece, 0, min(len(ops), 1024))
	for i, op := range ops {
		dst, err := p.addr(op.DstRegion, op.DstOff, op.Len)
		if err != nil {
			return nil, codeErr(errCode(err), "op %d: %w", i, err)
		}
		ps = appendPiece(ps, piece{dst: dst, src: op.Src, n: op.Len})
	}
	return ps, nil
}

// ipcPull copies a pull straight out of the peer's regions into ours.
func (s *Server) ipcPull(x *inXfer, m *wire.Submit) (err error) {
	ss := x.ss
	nc, err := ss.node.getConn(ss)
	if err != nil {
		return fallback(fbPeerUnreachable, err)
	}
	defer func() {
		reuse := err == nil
		if err != nil {
			// Let the peer drop the regions it may hold for us (a no-op
			// when it holds none); the connection stays usable if it answers.
			reuse = nc.call(&wire.DirectDone{Transfer: x.wireID}, -1) == nil
		}
		ss.node.putConn(nc, reuse)
	}()
	p, err := s.takeHandles(nc, ss, &wire.HandleRequest{Transfer: x.wireID, Dir: wire.Pull, Tag: x.tag, Regions: m.RemoteNames}, wire.AccessRemoteRead)
	if err != nil {
		return err
	}
	defer p.release()
	var ps []piece
	for i, op := range m.Ops {
		dst, err := x.regions[op.Local].Seg(op.LocalOff, op.Len)
		if err != nil {
			return codeErr(wire.CodeOutOfRange, "op %d: %w", i, err)
		}
		src, err := p.addr(op.Remote, op.RemoteOff, op.Len)
		if err != nil {
			return codeErr(errCode(err), "op %d: %w", i, err)
		}
		ps = appendPiece(ps, piece{dst: dst.Addr, src: src, n: op.Len})
	}
	x.touch()
	if err := s.copyDirect(ps); err != nil {
		return err
	}
	return nc.call(&wire.DirectDone{Transfer: x.wireID, Bytes: x.total}, -1)
}

// nackWait is how long a direct push whose handles were refused waits for
// the peer's Nack, which says why more precisely.
const nackWait = 200 * time.Millisecond
