package node

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// Push is one of our pushes as a same-node path moves it.
type Push struct {
	ID       uint64           // its wire id
	Tag      string           // the engine's tag, for the peer's Notify
	Regions  []string         // the peer's regions it writes, as its ops number them
	Ops      []staging.PlanOp // sources ours, destinations in Regions
	Total    uint64
	Plan     func() (*staging.Plan, error) // its chunk plan (shm), made once
	Announce *Announcer
	// Submitted is when the engine's request was admitted and Spawned
	// when the goroutine that moves it was started (for the same-node
	// push debug line; zero when unknown).
	Submitted, Spawned time.Time
}

// Pull is one of our pulls as a same-node path moves it.
type Pull struct {
	ID      uint64           // its wire id
	Tag     string           // the engine's tag, for the peer's Notify
	Regions []string         // the peer's regions it reads, as its ops number them
	Ops     []wire.LocalOp   // Local names an entry of Local
	Local   []*region.Region // our destination regions (references held)
	Total   uint64
	Touch   func() // records progress (the copy is under way)
}

// peerRegions are the peer's regions of one transfer, imported: handle i
// and its allocation (a reference held until release).
type peerRegions struct {
	p      *Peer
	hs     []*wire.RegionHandle
	allocs []*peerAlloc
}

// addr resolves [off, off+n) of peer region i, bounds-checked against the
// region the peer described.
func (pr *peerRegions) addr(i uint32, off, n uint64) (device.Addr, error) {
	if int(i) >= len(pr.hs) {
		return 0, status.Errorf(wire.CodeBadRequest, "peer region #%d of %d", i, len(pr.hs))
	}
	h := pr.hs[i]
	if n == 0 || !region.InRange(off, n, h.Length) {
		return 0, status.Errorf(wire.CodeOutOfRange, "offset %d + length %d is past the end of the peer's region #%d (%d B)", off, n, i, h.Length)
	}
	return pr.allocs[i].m.Base() + device.Addr(h.Offset+off), nil
}

func (pr *peerRegions) release() {
	for _, a := range pr.allocs {
		if err := pr.p.maps.release(a); err != nil {
			pr.p.r.o.Log.Warn(err.Error())
		}
	}
	pr.allocs = nil
}

// takeHandles asks the peer for the handles of a transfer's regions and
// imports them. Refusals (unknown region, access denied) are failures of
// the transfer; anything that keeps the path from working is a fallback.
func (p *Peer) takeHandles(nc *nodeConn, req *wire.HandleRequest, want wire.Access) (*peerRegions, error) {
	hs, fds, err := nc.handles(req)
	if err != nil {
		switch c := status.Code(err); {
		case c == wire.CodeUnsupported:
			return nil, Fallback(fbNotExportable, err)
		case c != wire.CodeInternal:
			return nil, err
		}
		return nil, Fallback(fbPeerUnreachable, err)
	}
	defer unixsock.CloseFDs(fds) // imports keep what they need
	pr := &peerRegions{p: p, hs: hs}
	for i, h := range hs {
		if h.Access&want != want {
			pr.release()
			return nil, status.Errorf(wire.CodeAccessDenied, "peer region %q does not grant %s", req.Regions[i], region.AccessString(want))
		}
		a, err := p.maps.acquire(h, fds[i])
		if err != nil {
			pr.release()
			return nil, Fallback(fbImportFailed, err)
		}
		pr.allocs = append(pr.allocs, a)
	}
	return pr, nil
}

// ipcPush copies a push straight into the receiver's regions and tells it.
func (p *Peer) ipcPush(x *Push) (err error) {
	t0 := time.Now()
	nc, dialed, err := p.getConn()
	if err != nil {
		return Fallback(fbPeerUnreachable, err)
	}
	keep := true // the connection stays usable (askWake may say not)
	defer func() { p.putConn(nc, err == nil && keep) }()
	tc := time.Now()
	// The copy's stream, with the link wake ahead of the handles' round
	// trip (wake.go).
	st, woke, unwake, err := p.wakeStream(x.Total)
	if err != nil {
		return err
	}
	defer unwake()
	defer func() {
		if st != nil {
			_ = st.Close()
		}
	}()
	x.Announce.viaNode(nc)
	pr, err := p.takeHandles(nc, &wire.HandleRequest{Transfer: x.ID, Dir: wire.Push, Tag: x.Tag, Regions: x.Regions}, wire.AccessRemoteWrite)
	if err != nil {
		return err
	}
	defer pr.release()
	ps, err := opPieces(x.Ops, pr)
	if err != nil {
		return err
	}
	if err := p.CheckNack(x.ID); err != nil {
		return err
	}
	t1 := time.Now()
	first := st
	st = nil // copyDirect closes it
	ct, err := p.r.copyDirect(ps, first)
	if err != nil {
		return err
	}
	t2 := time.Now()
	err = nc.call(&wire.DirectDone{Transfer: x.ID, Bytes: x.Total}, -1)
	if err == nil {
		if werr := p.askWake(nc); werr != nil {
			keep = false // the push is done; only the connection is out of step
			p.r.o.Log.Debug("link wake: "+werr.Error(), zap.String("peer", p.s.Ident().Name))
		}
	}
	// Where a same-node push's time goes (docs/BENCHMARKS.md profiles the
	// ipc row with these): from the engine's submit to starting the
	// goroutine that moves it (prep) and to here (sched), the
	// node connection (a dial and NodeHello when dialed), the handles'
	// round trip to the peer (after the stream and the link wake: woke),
	// the copy (its setup and the wait), and the peer's answer to
	// DirectDone.
	if ce := p.r.o.Log.Check(zap.DebugLevel, "same-node push"); ce != nil {
		var prep, sched time.Duration
		if !x.Submitted.IsZero() && !x.Spawned.IsZero() {
			prep, sched = x.Spawned.Sub(x.Submitted), t0.Sub(x.Spawned)
		}
		ce.Write(zap.Uint64("transfer", x.ID), zap.Uint64("bytes", x.Total), zap.Int("pieces", len(ps)),
			zap.Duration("prep", prep), zap.Duration("sched", sched), zap.Duration("conn", tc.Sub(t0)), zap.Bool("dialed", dialed),
			zap.Bool("woke", woke), zap.Duration("handles", t1.Sub(tc)), zap.Duration("copy", t2.Sub(t1)), zap.Duration("copy_setup", ct.setup),
			zap.Duration("copy_wait", ct.wait), zap.Duration("done", time.Since(t2)))
	}
	return err
}

// opPieces turns a push's ops into copies, each destination resolved (and
// bounds-checked) in the peer's regions; adjacent ops merge.
func opPieces(ops []staging.PlanOp, pr *peerRegions) ([]piece, error) {
	ps := make([]piece, 0, min(len(ops), 1024))
	for i, op := range ops {
		dst, err := pr.addr(op.DstRegion, op.DstOff, op.Len)
		if err != nil {
			return nil, status.Errorf(status.Code(err), "op %d: %w", i, err)
		}
		ps = appendPiece(ps, piece{dst: dst, src: op.Src, n: op.Len})
	}
	return ps, nil
}

// Pull copies a pull straight out of the peer's regions into ours.
func (p *Peer) Pull(x *Pull) (err error) {
	nc, _, err := p.getConn()
	if err != nil {
		return Fallback(fbPeerUnreachable, err)
	}
	defer func() {
		reuse := err == nil
		if err != nil {
			// Let the peer drop the regions it may hold for us (a no-op
			// when it holds none); the connection stays usable if it answers.
			reuse = nc.call(&wire.DirectDone{Transfer: x.ID}, -1) == nil
		}
		p.putConn(nc, reuse)
	}()
	pr, err := p.takeHandles(nc, &wire.HandleRequest{Transfer: x.ID, Dir: wire.Pull, Tag: x.Tag, Regions: x.Regions}, wire.AccessRemoteRead)
	if err != nil {
		return err
	}
	defer pr.release()
	var ps []piece
	for i, op := range x.Ops {
		dst, err := x.Local[op.Local].Seg(op.LocalOff, op.Len)
		if err != nil {
			return status.Errorf(wire.CodeOutOfRange, "op %d: %w", i, err)
		}
		src, err := pr.addr(op.Remote, op.RemoteOff, op.Len)
		if err != nil {
			return status.Errorf(status.Code(err), "op %d: %w", i, err)
		}
		ps = appendPiece(ps, piece{dst: dst.Addr, src: src, n: op.Len})
	}
	x.Touch()
	if _, err := p.r.copyDirect(ps, nil); err != nil {
		return err
	}
	return nc.call(&wire.DirectDone{Transfer: x.ID, Bytes: x.Total}, -1)
}

// NackWait is how long a direct push whose handles were refused waits for
// the peer's Nack, which says why more precisely.
const NackWait = 200 * time.Millisecond

// Announcer sends a push's Announce once: on the control session, or, for
// an ipc push, on the node connection right before the handle request, so
// the peer admits the push and answers the request in one wake-up instead
// of waiting for the Announce to come through its control loop.
type Announcer struct {
	once sync.Once
	send func(wire.Msg) // on the control session
	m    *wire.Announce
}

// NewAnnouncer is the Announcer of m, with send the control session's.
func NewAnnouncer(send func(wire.Msg), m *wire.Announce) *Announcer {
	return &Announcer{send: send, m: m}
}

// ViaControl sends the Announce on the control session unless it went out.
func (a *Announcer) ViaControl() { a.once.Do(func() { a.send(a.m) }) }

// viaNode sends the Announce on nc unless it went out. If nc fails, the
// Announce goes on the control session instead: the transfer then falls
// back to TCP, which needs it.
func (a *Announcer) viaNode(nc *nodeConn) {
	a.once.Do(func() {
		if err := unixsock.WriteFrame(nc.c, a.m, -1); err != nil {
			a.send(a.m)
		}
	})
}

// Push moves a push on transport t (IPC or Shm); its Nack is watched
// from now on (see Nack), until Unwatch.
func (p *Peer) Push(x *Push, t Transport) error {
	p.WatchNacks(x.ID)
	if t == Shm {
		x.Announce.ViaControl()
		return p.shmPush(x)
	}
	return p.ipcPush(x)
}
