package node

import (
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/internal/knobs"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/wire"
)

// Session is a peer session as the same-node room sees it; the sidecar
// implements it over its control session.
type Session interface {
	// Ident is who the peer is; fixed once the handshake is done.
	Ident() Ident
	// Proof is the session's node proof: an HMAC under the shared token
	// over the session id and both nonces.
	Proof() [wire.ProofSize]byte
	// Send queues a frame on the control session (Revoke).
	Send(m wire.Msg)
	// AcceptPush admits a push announced on a node connection, or
	// refuses it with a Nack on the control session, as for an Announce
	// that came on the control session.
	AcceptPush(m *wire.Announce)
	// IncomingPush is the peer's push id landing here, nil when there is
	// none (unknown, refused, finished, or not a push of the peer's);
	// wait: wait a while for its Announce, which may come after the frame
	// that names it.
	IncomingPush(id uint64, wait bool) Incoming
	// ServedPull counts a pull of ours the peer copied directly out of
	// our regions and notifies the engines owning regions of it.
	ServedPull(id uint64, tag string, bytes uint64, regions []*region.Region)
	// Fallback counts a transfer of the session that fell back to TCP.
	Fallback(reason string)
}

// Ident is who a session's peer is.
type Ident struct {
	Name      string                   // the peer's node name
	Link      string                   // the link's name in stats
	ID        [wire.SessionIDSize]byte // the session id a NodeHello names
	Dialer    bool                     // we dialed: our transfer ids are odd
	SameHost  bool                     // the peer reported our host id
	ChunkSize int                      // the session's chunk size: a shared ring's slot
}

// ours reports whether a wire id was allocated by our side.
func (id Ident) ours(wireID uint64) bool { return (wireID&1 == 1) == id.Dialer }

// Incoming is a peer's push landing here, as the same-node room sees it.
type Incoming interface {
	// Regions are its destination regions, in the Announce's order.
	Regions() []*region.Region
	// Total is its length (Announce.Total).
	Total() uint64
	// Touch records progress (a direct copy is under way).
	Touch()
	// LandedDirect completes it: the peer copied all n bytes directly.
	LandedDirect(n uint64) error
	// Fail ends it with err; tellPeer sends a Nack.
	Fail(err error, tellPeer bool)
	// ViaRing marks it as landing through a shared ring: its chunks are
	// answered on the node connection, not with Ack or Credit.
	ViaRing()
	// Resolve checks a chunk against it, as a chunk from a data stream,
	// and appends its device ranges to segs; on success the caller owes
	// a Release.
	Resolve(ch *wire.Chunk, segs []device.Seg) ([]device.Seg, error)
	// Landed records the scatter of chunk idx of n bytes: landed (err
	// nil) or failed.
	Landed(idx uint32, n uint64, err error)
	// Release drops what a successful Resolve held.
	Release()
}

// Peer is a session's same-node state: what the peer offered (NodeInfo),
// the allocations imported from its handles, the node connections of both
// roles, and pulls served directly.
type Peer struct {
	r        *Room
	s        Session
	info     chan struct{} // closed once the peer's NodeInfo arrived
	infoOnce sync.Once
	peerSock string // set before info is closed
	peerDev  string
	maps     *peerMaps

	mu     sync.Mutex
	closed bool
	conns  map[*net.UnixConn]struct{} // every node connection of the session
	idle   []*nodeConn                // importer connections ready for reuse
	given  map[uint64]struct{}        // ids of our regions whose handles the peer got
	served map[uint64]*servedDirect   // pulls the peer copies directly, by wire id
	logged map[string]bool            // fallback reasons logged for this session
	broken string                     // why the direct path is off for this session
	nacks  map[uint64]chan error      // direct pushes waiting for the peer's verdict
	// The peer's wake buffer (wake.go): wakeState says whether it was
	// asked for and imported (wake, wakeLen bytes).
	wakeState int
	wake      *peerAlloc
	wakeLen   uint64
}

// servedDirect is a pull whose source regions the peer reads directly.
type servedDirect struct {
	tag     string
	regions []*region.Region
}

// DefaultIdleConn is how long an unused importer connection is kept
// (node.idle_conn_timeout's default): long enough that an engine pushing
// every few seconds does not pay a dial and NodeHello (0.2-0.35 ms on 2 x
// H200) each time; an idle one costs an fd and a goroutine on each side.
// A connection holding a shared ring (up to 1 GiB pinned on each side)
// goes after idleRingConn at most.
const (
	DefaultIdleConn = 30 * time.Second
	idleRingConn    = 2 * time.Second
)

// NewPeer makes the same-node state of session s.
func (r *Room) NewPeer(s Session) *Peer {
	p := &Peer{r: r, s: s, info: make(chan struct{}), conns: map[*net.UnixConn]struct{}{},
		given: map[uint64]struct{}{}, served: map[uint64]*servedDirect{}, logged: map[string]bool{}, nacks: map[uint64]chan error{}}
	p.maps = newPeerMaps(r.importPeer)
	return p
}

// importPeer imports a peer's allocation on our device, unless the fault
// injection of the same-node paths says to fail (Options.FaultImport, the
// test switch STAGE_TEST_FAULT_IPC_IMPORT), so that ipc transfers fall back
// to TCP (counted as reason import_failed).
func (r *Room) importPeer(h device.Handle) (device.Mapping, error) {
	if r.o.FaultImport {
		return nil, errors.New("import refused on purpose (fault injection " + knobs.FaultIPCImportEnv + "=1)")
	}
	return r.o.Dev.Import(h)
}

// SetInfo records the peer's NodeInfo (the first one counts).
func (p *Peer) SetInfo(m *wire.NodeInfo) {
	p.infoOnce.Do(func() {
		p.peerSock, p.peerDev = m.Socket, m.Device
		close(p.info)
	})
}

// waitInfo waits up to d for the peer's NodeInfo.
func (p *Peer) waitInfo(d time.Duration) bool {
	select {
	case <-p.info:
		return true
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.info:
		return true
	case <-t.C:
		return false
	}
}

// peerKind is the device kind the peer offered ("cuda" of "cuda:1").
func (p *Peer) peerKind() device.Kind {
	k, _, _ := strings.Cut(p.peerDev, ":")
	return device.Kind(k)
}

// track records a node connection of the session; false once closed.
func (p *Peer) track(c *net.UnixConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Peer) untrack(c *net.UnixConn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// handed records that the peer holds the handle of our region id.
func (p *Peer) handed(id uint64) {
	p.mu.Lock()
	p.given[id] = struct{}{}
	p.mu.Unlock()
}

// Revoke tells the peer that our region id is gone, if it was given its
// handle.
func (p *Peer) Revoke(id uint64) {
	p.mu.Lock()
	_, had := p.given[id]
	delete(p.given, id)
	p.mu.Unlock()
	if had {
		p.s.Send(&wire.Revoke{RegionID: id})
	}
}

// Revoked drops the import of the peer's region id (its Revoke).
func (p *Peer) Revoked(id uint64) error { return p.maps.revoke(id) }

// Mappings is how many of the peer's allocations are imported now.
func (p *Peer) Mappings() int { return int(p.maps.open.Load()) }

// serve records a pull the peer copies directly; false for a duplicate id.
func (p *Peer) serve(id uint64, tag string, rs []*region.Region) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, dup := p.served[id]; dup || p.closed {
		return false
	}
	p.served[id] = &servedDirect{tag: tag, regions: rs}
	return true
}

func (p *Peer) unserve(id uint64) *servedDirect {
	p.mu.Lock()
	defer p.mu.Unlock()
	sv := p.served[id]
	delete(p.served, id)
	return sv
}

// LogOnce reports whether reason is new for this session.
func (p *Peer) LogOnce(reason string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.logged[reason] {
		return false
	}
	p.logged[reason] = true
	return true
}

// Expire closes importer connections idle for node.idle_conn_timeout, or
// idleRingConn where they hold a shared ring. When the last of them goes,
// the peer's wake buffer is let go too (asked for again after the next
// push), so that an idle session holds no mapping.
func (p *Peer) Expire(now time.Time) {
	p.mu.Lock()
	var old []*nodeConn
	keep := p.idle[:0]
	for _, nc := range p.idle {
		limit := p.r.o.IdleConn
		if limit <= 0 {
			limit = DefaultIdleConn
		}
		if nc.ring != nil {
			limit = min(limit, idleRingConn)
		}
		if now.Sub(nc.last) > limit {
			old = append(old, nc)
		} else {
			keep = append(keep, nc)
		}
	}
	p.idle = keep
	unwake := len(old) > 0 && len(keep) == 0 && p.wakeState == wakeHave
	if unwake {
		p.wakeState, p.wake, p.wakeLen = wakeUnasked, nil, 0
	}
	p.mu.Unlock()
	for _, nc := range old {
		p.drop(nc)
	}
	if unwake {
		if err := p.maps.revoke(0); err != nil { // a push waking the link keeps it until its copy ends
			p.r.o.Log.Warn("let go of the peer's wake buffer", zap.String("peer", p.s.Ident().Name), zap.Error(err))
		}
	}
}

// Shut ends the session's same-node state: connections closed, imported
// allocations let go (copies running keep theirs until they finish),
// pulls served directly released.
func (p *Peer) Shut() {
	p.mu.Lock()
	p.closed = true
	conns := make([]*net.UnixConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	idle := p.idle
	p.idle = nil
	served := p.served
	p.served = map[uint64]*servedDirect{}
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	for _, nc := range idle {
		p.drop(nc)
	}
	for _, sv := range served {
		region.ReleaseAll(sv.regions)
	}
	if err := p.maps.closeAll(); err != nil {
		p.r.o.Log.Warn("close allocations imported from a peer", zap.String("peer", p.s.Ident().Name), zap.Error(err))
	}
}
