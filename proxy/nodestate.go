package proxy

import (
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/wire"
)

// nodeState is a session's same-node state: what the peer offered
// (NodeInfo), the allocations imported from its handles, the node
// connections of both roles, and pulls served directly.
type nodeState struct {
	s        *Server
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
}

// servedDirect is a pull whose source regions the peer reads directly.
type servedDirect struct {
	tag     string
	regions []*region.Region
}

// idleNodeConn is how long an unused importer connection is kept.
const idleNodeConn = 2 * time.Second

func newNodeState(s *Server) *nodeState {
	n := &nodeState{s: s, info: make(chan struct{}), conns: map[*net.UnixConn]struct{}{},
		given: map[uint64]struct{}{}, served: map[uint64]*servedDirect{}, logged: map[string]bool{}, nacks: map[uint64]chan error{}}
	n.maps = newPeerMaps(s.importPeer)
	return n
}

// importPeer imports a peer's allocation on our device, unless the fault
// injection of the same-node paths says to fail (STAGE_TEST_FAULT_IPC_IMPORT).
func (s *Server) importPeer(h device.Handle) (device.Mapping, error) {
	if s.faultImport {
		return nil, errors.New("import refused on purpose (fault injection " + FaultImportEnv + "=1)")
	}
	return s.dev.Import(h)
}

func (ss *session) sameHost() bool { return ss.peerHost != "" && ss.peerHost == ss.s.hostID }

// setInfo records the peer's NodeInfo (the first one counts).
func (n *nodeState) setInfo(m *wire.NodeInfo) {
	n.infoOnce.Do(func() {
		n.peerSock, n.peerDev = m.Socket, m.Device
		close(n.info)
	})
}

// waitInfo waits up to d for the peer's NodeInfo.
func (n *nodeState) waitInfo(d time.Duration) bool {
	select {
	case <-n.info:
		return true
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-n.info:
		return true
	case <-t.C:
		return false
	}
}

// peerKind is the device kind the peer offered ("cuda" of "cuda:1").
func (n *nodeState) peerKind() device.Kind {
	k, _, _ := strings.Cut(n.peerDev, ":")
	return device.Kind(k)
}

// track records a node connection of the session; false once closed.
func (n *nodeState) track(c *net.UnixConn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.conns[c] = struct{}{}
	return true
}

func (n *nodeState) untrack(c *net.UnixConn) {
	n.mu.Lock()
	delete(n.conns, c)
	n.mu.Unlock()
}

// handed records that the peer holds the handle of our region id.
func (n *nodeState) handed(id uint64) {
	n.mu.Lock()
	n.given[id] = struct{}{}
	n.mu.Unlock()
}

// revoke tells the peer that region id is gone, if it was given its handle.
func (ss *session) revoke(id uint64) {
	n := ss.node
	n.mu.Lock()
	_, had := n.given[id]
	delete(n.given, id)
	n.mu.Unlock()
	if had {
		ss.send(&wire.Revoke{RegionID: id})
	}
}

// serve records a pull the peer copies directly; false for a duplicate id.
func (n *nodeState) serve(id uint64, tag string, rs []*region.Region) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, dup := n.served[id]; dup || n.closed {
		return false
	}
	n.served[id] = &servedDirect{tag: tag, regions: rs}
	return true
}

func (n *nodeState) unserve(id uint64) *servedDirect {
	n.mu.Lock()
	defer n.mu.Unlock()
	sv := n.served[id]
	delete(n.served, id)
	return sv
}

// logOnce reports whether reason is new for this session.
func (n *nodeState) logOnce(reason string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.logged[reason] {
		return false
	}
	n.logged[reason] = true
	return true
}

// expire closes importer connections idle for idleNodeConn.
func (n *nodeState) expire(now time.Time) {
	n.mu.Lock()
	var old []*nodeConn
	keep := n.idle[:0]
	for _, nc := range n.idle {
		if now.Sub(nc.last) > idleNodeConn {
			old = append(old, nc)
		} else {
			keep = append(keep, nc)
		}
	}
	n.idle = keep
	n.mu.Unlock()
	for _, nc := range old {
		n.drop(nc)
	}
}

// shut ends the session's same-node state: connections closed, imported
// allocations let go (copies running keep theirs until they finish),
// pulls served directly released.
func (n *nodeState) shut() {
	n.mu.Lock()
	n.closed = true
	conns := make([]*net.UnixConn, 0, len(n.conns))
	for c := range n.conns {
		conns = append(conns, c)
	}
	idle := n.idle
	n.idle = nil
	served := n.served
	n.served = map[uint64]*servedDirect{}
	n.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	for _, nc := range idle {
		n.drop(nc)
	}
	for _, sv := range served {
		region.ReleaseAll(sv.regions)
	}
	if err := n.maps.closeAll(); err != nil {
		n.s.log.Warn("close allocations imported from a peer", zap.Error(err))
	}
}
