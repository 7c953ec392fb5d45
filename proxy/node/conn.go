package node

import (
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// nodeConn is the importer's end of a node connection: requests go out and
// answers come back in order, one transfer at a time. Connections are
// pooled per session and closed after node.idle_conn_timeout unused
// (idleRingConn at most with a shared ring).
type nodeConn struct {
	c    *net.UnixConn
	buf  []byte
	ring *shmRing // the shared ring of this connection (shm), nil until used
	last time.Time
}

// getConn returns an idle connection to the peer's node socket or dials one.
func (p *Peer) getConn() (nc *nodeConn, dialed bool, err error) {
	p.mu.Lock()
	if k := len(p.idle); k > 0 {
		nc := p.idle[k-1]
		p.idle = p.idle[:k-1]
		p.mu.Unlock()
		return nc, false, nil
	}
	p.mu.Unlock()
	id := p.s.Ident()
	path := filepath.Join(p.r.o.Dir, p.peerSock)
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, false, fmt.Errorf("dial the node socket of %s at %s (is node.socket_dir the same directory for both sidecars?): %w", id.Name, path, err)
	}
	if !p.track(c) {
		_ = c.Close()
		return nil, false, fmt.Errorf("session with %s closed", id.Name)
	}
	nc = &nodeConn{c: c}
	_ = c.SetDeadline(time.Now().Add(p.r.o.HandshakeTimeout))
	if err := nc.call(&wire.NodeHello{SessionID: id.ID, Proof: p.s.Proof()}, -1); err != nil {
		p.drop(nc)
		return nil, false, fmt.Errorf("node socket of %s: %w", id.Name, err)
	}
	_ = c.SetDeadline(time.Time{})
	return nc, true, nil
}

// putConn returns a connection for reuse, or closes it when it may be out
// of step (an error happened on it) or the session closed.
func (p *Peer) putConn(nc *nodeConn, reuse bool) {
	p.mu.Lock()
	if reuse && !p.closed {
		nc.last = time.Now()
		p.idle = append(p.idle, nc)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.drop(nc)
}

// drop closes a connection and its ring.
func (p *Peer) drop(nc *nodeConn) {
	p.untrack(nc.c)
	_ = nc.c.Close()
	if nc.ring != nil {
		if err := nc.ring.close(); err != nil {
			p.r.o.Log.Warn("close shared ring: " + err.Error())
		}
		nc.ring = nil
	}
}

// answerSpin is how long node-socket readers poll for the next frame
// before they sleep in the read: answers come within a few hundred
// microseconds (the exporter's wake-up and work), and the next request of
// a busy session as fast. On a virtual machine each thread woken from
// sleep costs 50-200 us on a same-node transfer's critical path, several
// times per transfer. Polling needs spare cores: it is off where the
// readers' default polling is (spin.Default, fewer than spin.MinCPUs).
var answerSpin = func() time.Duration {
	if spin.Default() == 0 {
		return 0
	}
	return 400 * time.Microsecond
}()

// read reads one answer; the fd that came with it is the caller's.
func (nc *nodeConn) read() (wire.Msg, int, error) {
	spin.Readable(nc.c, answerSpin)
	var m wire.Msg
	var fd int
	var err error
	_, m, fd, nc.buf, err = unixsock.ReadFrame(nc.c, nc.buf)
	if err != nil {
		return nil, -1, fmt.Errorf("read from node socket: %w", err)
	}
	return m, fd, nil
}

// call writes m (with fd) and expects OK; a Fail becomes a coded error.
func (nc *nodeConn) call(m wire.Msg, fd int) error {
	if err := unixsock.WriteFrame(nc.c, m, fd); err != nil {
		return err
	}
	a, afd, err := nc.read()
	unixsock.CloseFD(afd)
	if err != nil {
		return err
	}
	switch a := a.(type) {
	case *wire.OK:
		return nil
	case *wire.Fail:
		return status.Errorf(a.Code, "peer refused %s: %s", m.Type(), a.Message)
	}
	return fmt.Errorf("answer to %s is %s, want OK or Fail", m.Type(), a.Type())
}

// handles sends a HandleRequest and reads one RegionHandle per region, in
// order. The fds returned (-1 where none) are the caller's to close; on
// error none are left open.
func (nc *nodeConn) handles(req *wire.HandleRequest) ([]*wire.RegionHandle, []int, error) {
	if err := unixsock.WriteFrame(nc.c, req, -1); err != nil {
		return nil, nil, err
	}
	hs := make([]*wire.RegionHandle, 0, len(req.Regions))
	fds := make([]int, 0, len(req.Regions))
	fail := func(err error) ([]*wire.RegionHandle, []int, error) {
		unixsock.CloseFDs(fds)
		return nil, nil, err
	}
	for len(hs) < len(req.Regions) {
		m, fd, err := nc.read()
		if err != nil {
			return fail(err)
		}
		switch m := m.(type) {
		case *wire.Fail:
			unixsock.CloseFD(fd)
			return fail(status.Errorf(m.Code, "%s", m.Message))
		case *wire.RegionHandle:
			fds = append(fds, fd)
			if m.Transfer != req.Transfer || int(m.Index) != len(hs) {
				return fail(fmt.Errorf("got the handle of transfer %d region #%d, want transfer %d region #%d", m.Transfer, m.Index, req.Transfer, len(hs)))
			}
			hs = append(hs, m)
		default:
			unixsock.CloseFD(fd)
			return fail(fmt.Errorf("answer to HandleRequest is %s", m.Type()))
		}
	}
	return hs, fds, nil
}
