package node

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// The node socket: a Unix stream socket in node.socket_dir, which every
// sidecar of a node (or every pod mounting that directory) shares. A peer
// on the same node connects to it to take handles of this sidecar's
// regions (the exporter's side is serve.go; the importer's
// conn.go). The directory is 0700 and the socket 0600; a connection
// must prove membership of an established peer session (NodeHello)
// before anything else.

// Host is the sidecar as the same-node room sees it; the server
// implements it.
type Host interface {
	// Peer is the same-node state of the established session whose id a
	// NodeHello names; nil when there is none.
	Peer(sid [wire.SessionIDSize]byte) *Peer
	// Copier is a copy stream for the shared ring's gathers and scatters.
	Copier() *staging.Copier
	// Fallback counts a transfer that fell back to TCP, in the metrics.
	Fallback(reason string)
}

// Options are what the room takes from the sidecar's config and state.
type Options struct {
	Dev              device.Device
	Regions          *region.Table // our regions, whose handles peers take
	Log              *zap.Logger
	Dir              string        // node.socket_dir
	HandshakeTimeout time.Duration // for a NodeHello
	FaultImport      bool          // every import fails: a test fault switch (knobs.FaultIPCImportEnv)
	CopyStreams      int           // node.copy_streams: streams a large direct copy is split across
	IdleConn         time.Duration // node.idle_conn_timeout: an unused importer connection is kept this long (0: DefaultIdleConn)
	// WakeLink: our ipc pushes wake the link first, into the peer's wake
	// buffer where it offers one (node.wake_link; wake.go).
	WakeLink bool
	// NewWake makes the wake buffer we offer peers (DeviceWake); nil: we
	// offer none.
	NewWake func() (*WakeBuffer, error)
	// TrustSocketParent: security.trust_socket_parent (unixsock.MakeDir).
	TrustSocketParent bool
	// WG is the sidecar's wait group: goroutines of node connections and
	// direct transfers belong to it, so its Close waits for them.
	WG *sync.WaitGroup
}

// Room is the sidecar's same-node room: its node socket, the connections
// on it, and what the same-node state of every session (Peer) shares.
type Room struct {
	h       Host
	o       Options
	ln      *net.UnixListener // nil: no node socket; same-node paths off
	name    string
	closing atomic.Bool

	mu    sync.Mutex
	conns map[*net.UnixConn]struct{}
	wake  wakeBuf // the wake buffer we offer, made on the first LinkWake
}

// Listen creates this sidecar's node socket; on failure the same-node
// paths are off (transfers fall back to TCP, counted) and the reason
// logged, and the room still serves sessions' state.
func Listen(h Host, o Options) *Room {
	r := &Room{h: h, o: o, conns: map[*net.UnixConn]struct{}{}}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("crypto/rand failed: " + err.Error()) // the platform has no randomness: nothing safe to do
	}
	name := "n-" + hex.EncodeToString(b[:]) + ".sock"
	ln, err := unixsock.Listen(filepath.Join(o.Dir, name), o.TrustSocketParent)
	if err != nil {
		o.Log.Warn("same-node paths off: cannot serve a node socket; transfers to peers on this node use TCP", zap.String("dir", o.Dir), zap.Error(fmt.Errorf("node socket: %w", err)))
		return r
	}
	r.ln, r.name = ln, name
	return r
}

// Name is the node socket's name in node.socket_dir, for NodeInfo; empty
// when there is none.
func (r *Room) Name() string { return r.name }

// Serve accepts node connections until Close; ctx ending quiets the log
// of connections that end.
func (r *Room) Serve(ctx context.Context) {
	if r.ln == nil {
		return
	}
	r.o.WG.Add(1)
	go r.accept(ctx)
}

// accept serves the node socket.
func (r *Room) accept(ctx context.Context) {
	defer r.o.WG.Done()
	for {
		c, err := r.ln.AcceptUnix()
		if err != nil {
			if r.closing.Load() {
				return
			}
			r.o.Log.Warn("accept on node socket", zap.Error(err))
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if !r.track(c) {
			_ = c.Close()
			return
		}
		r.o.WG.Add(1)
		go func() {
			defer r.o.WG.Done()
			defer r.untrack(c)
			if err := r.serve(c); err != nil && ctx.Err() == nil {
				r.o.Log.Warn("node socket connection ended", zap.Error(err))
			}
		}()
	}
}

// track records a node connection so that Close can end it; false
// once the sidecar is closing.
func (r *Room) track(c *net.UnixConn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing.Load() {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Room) untrack(c *net.UnixConn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	_ = c.Close()
}

// Close closes the node listener and every node connection (shutdown).
func (r *Room) Close() {
	r.closing.Store(true)
	if r.ln != nil {
		_ = r.ln.Close()
	}
	r.mu.Lock()
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
}

// hello authenticates a node connection: the first frame must name an
// established session with a peer on this node and carry its proof.
func (r *Room) hello(c *net.UnixConn) (*Peer, error) {
	_ = c.SetDeadline(time.Now().Add(r.o.HandshakeTimeout))
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
	p := r.h.Peer(h.SessionID)
	if p == nil {
		_ = unixsock.WriteFrame(c, &wire.Fail{Code: wire.CodeAuthFailed, Message: "unknown session"}, -1)
		return nil, errors.New("NodeHello for an unknown session")
	}
	id := p.s.Ident()
	if want := p.s.Proof(); !hmac.Equal(want[:], h.Proof[:]) {
		_ = unixsock.WriteFrame(c, &wire.Fail{Code: wire.CodeAuthFailed, Message: "authentication failed"}, -1)
		return nil, fmt.Errorf("node connection for the session with %s: wrong proof", id.Name)
	}
	if !id.SameHost {
		_ = unixsock.WriteFrame(c, &wire.Fail{Code: wire.CodeAccessDenied, Message: "the session's peer is not on this node"}, -1)
		return nil, fmt.Errorf("node connection for the session with %s, whose host id is not ours", id.Name)
	}
	if err := unixsock.WriteFrame(c, &wire.OK{}, -1); err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return p, nil
}
