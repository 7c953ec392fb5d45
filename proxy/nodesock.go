package proxy

import (
	"crypto/hmac"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// The node socket: a Unix stream socket in node.socket_dir, which every
// sidecar of a node (or every pod mounting that directory) shares. A peer
// on the same node connects to it to take handles of this sidecar's
// regions (the exporter's side is this file; the importer's nodeconn.go).
// The directory is 0700 and the socket 0600; a connection must prove
// membership of an established peer session (NodeHello) before anything
// else.

// listenNode creates this sidecar's node socket; on failure the same-node
// paths are off (transfers fall back to TCP, counted) and the reason logged.
func (s *Server) listenNode() {
	dir := s.cfg.NodeSocketDir()
	fail := func(err error) {
		s.log.Warn("same-node paths off: cannot serve a node socket; transfers to peers on this node use TCP", zap.String("dir", dir), zap.Error(err))
	}
	var b [8]byte
	randBytes(b[:])
	name := "n-" + hex.EncodeToString(b[:]) + ".sock"
	ln, err := unixsock.Listen(filepath.Join(dir, name))
	if err != nil {
		fail(fmt.Errorf("node socket: %w", err))
		return
	}
	s.nodeLn, s.nodeName = ln, name
}

// acceptNode serves the node socket.
func (s *Server) acceptNode() {
	defer s.wg.Done()
	for {
		c, err := s.nodeLn.AcceptUnix()
		if err != nil {
			if s.closing.Load() {
				return
			}
			s.log.Warn("accept on node socket", zap.Error(err))
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if !s.trackNode(c) {
			_ = c.Close()
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.untrackNode(c)
			if err := s.serveNode(c); err != nil && s.ctx.Err() == nil {
				s.log.Warn("node socket connection ended", zap.Error(err))
			}
		}()
	}
}

// trackNode records a node connection so that Close can end it; false
// once the sidecar is closing.
func (s *Server) trackNode(c *net.UnixConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	s.nodeConns[c] = struct{}{}
	return true
}

func (s *Server) untrackNode(c *net.UnixConn) {
	s.mu.Lock()
	delete(s.nodeConns, c)
	s.mu.Unlock()
	_ = c.Close()
}

// closeNode closes the node listener and every node connection (shutdown).
func (s *Server) closeNode() {
	if s.nodeLn != nil {
		_ = s.nodeLn.Close()
	}
	s.mu.Lock()
	for c := range s.nodeConns {
		_ = c.Close()
	}
	s.mu.Unlock()
}

func (ss *session) nodeProof() [wire.ProofSize]byte {
	return proof(ss.s.token, "stage-node", ss.sid[:], ss.nonceC[:], ss.nonceS[:])
}

// nodeHello authenticates a node connection: the first frame must name an
// established session with a peer on this node and carry its proof.
func (s *Server) nodeHello(c *net.UnixConn) (*session, error) {
	_ = c.SetDeadline(time.Now().Add(s.handshakeTimeout()))
	_, m, fd, _, err := unixsock.ReadFrame(c, nil)
	unixsock.CloseFD(fd)
	if err != nil {
		return nil, fmt.Errorf("read NodeHello: %w", err)
	}
	h, ok := m.(*wire.NodeHello)
	if !ok {
		_ = unixsock.WriteFrame(c, &wire.Fail{Code: wire.CodeMalformed, Message: "expected NodeHello"}, -1)
		return nil, fmt.Errorf("first frame is %s, not NodeHello", m.Type())
	}
	s.mu.Lock()
	var ss *session
	for _, x := range s.sessions {
		if x.sid == h.SessionID {
			ss = x
			break
		}
	}
	s.mu.Unlock()
	if ss == nil {
		_ = unixsock.WriteFrame(c, &wire.Fail{Code: wire.CodeAuthFailed, Message: "unknown session"}, -1)
		return nil, errors.New("NodeHello for an unknown session")
	}
	if want := ss.nodeProof(); !hmac.Equal(want[:], h.Proof[:]) {
		_ = unixsock.WriteFrame(c, &wire.Fail{Code: wire.CodeAuthFailed, Message: "authentication failed"}, -1)
		return nil, fmt.Errorf("node connection for the session with %s: wrong proof", ss.peerName)
	}
	if !ss.sameHost() {
		_ = unixsock.WriteFrame(c, &wire.Fail{Code: wire.CodeAccessDenied, Message: "the session's peer is not on this node"}, -1)
		return nil, fmt.Errorf("node connection for the session with %s, whose host id %q is not ours", ss.peerName, ss.peerHost)
	}
	if err := unixsock.WriteFrame(c, &wire.OK{}, -1); err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return ss, nil
}
