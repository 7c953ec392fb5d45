// Handshakes: dialing and accepting peers, the token proofs, and attaching
// data streams to an authenticated session. limits.handshake_timeout
// bounds every step before a session or a data stream is established, so
// a peer that connects and says nothing cannot hold a goroutine for long.

package proxy

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"

	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// proof is the HMAC-SHA256 of label and parts under the shared token: what
// each side shows to prove it holds the token without sending it.
func proof(token []byte, label string, parts ...[]byte) (p [wire.ProofSize]byte) {
	m := hmac.New(sha256.New, token)
	m.Write([]byte(label))
	for _, x := range parts {
		m.Write(x)
	}
	copy(p[:], m.Sum(nil))
	return p
}

// dataProof is what the DataHello of ss's data stream stream proves.
func (hs handshaker) dataProof(ss *session, stream uint16) [wire.ProofSize]byte {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], stream)
	return proof(hs.s.token, "stage-data", ss.sid[:], b[:], ss.nonceC[:], ss.nonceS[:])
}

func writeMsg(c net.Conn, m wire.Msg) error {
	buf := bytebufferpool.Get()
	defer bytebufferpool.Put(buf)
	buf.B = wire.AppendFrame(buf.B[:0], m, false, 0)
	_, err := c.Write(buf.B)
	return err
}

// expect reads one frame and requires type t; an Error frame becomes an error.
func expect[T wire.Msg](c net.Conn, what string) (T, error) {
	var zero T
	_, m, _, err := wire.ReadFrame(c, nil)
	if err != nil {
		return zero, fmt.Errorf("read %s: %w", what, err)
	}
	if e, ok := m.(*wire.Error); ok {
		return zero, codeErr(e.Code, "peer refused: %s", e.Message)
	}
	t, ok := m.(T)
	if !ok {
		return zero, fmt.Errorf("expected %s, got %s", what, m.Type())
	}
	return t, nil
}

// handshaker is the server as it meets peers: it dials and accepts peer
// connections, runs the token handshake of a control session and the
// proof of a data stream, and makes an established session live
// (register). The listener and the pre-authentication bounds it works
// under (preauth.go) are the server's.
type handshaker struct{ s *Server }

// dial opens a session to addr for route r: control handshake, then the
// data streams, then hands the control connection to gnet.
func (hs handshaker) dial(ctx context.Context, r *route, addr string) (*session, error) {
	s := hs.s
	d := net.Dialer{Timeout: r.Conf().ConnectTimeout}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c, err := s.tls.dial(ctx, raw, addr, s.cfg.Limits.HandshakeTimeout)
	if err != nil {
		_ = raw.Close()
		return nil, err
	}
	ss := s.newSession(true, r.Conf().Stripes)
	ss.route, ss.addr, ss.linkName, ss.remote = r, addr, r.Conf().Name, raw.RemoteAddr().String()
	ss.link = s.links.get(r.Conf().Name)
	_ = c.SetDeadline(time.Now().Add(s.cfg.Limits.HandshakeTimeout))
	// The route removed or the sidecar closing meanwhile ends the
	// handshake at once, not at its deadline.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	randBytes(ss.nonceC[:])
	hello := &wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, NodeName: s.cfg.Node.Name,
		HostID: s.hostID, Nonce: ss.nonceC, SlotSize: uint32(s.cfg.Staging.SlotSize), Window: uint32(s.cfg.Staging.Window)}
	fail := func(err error) (*session, error) {
		_ = c.Close()
		ss.cancel()
		return nil, err
	}
	if err := writeMsg(c, hello); err != nil {
		return fail(fmt.Errorf("send hello: %w", err))
	}
	ch, err := expect[*wire.Challenge](c, "challenge")
	if err != nil {
		return fail(s.tls.dialErr(addr, err))
	}
	ss.nonceS = ch.Nonce
	if want := proof(s.token, "stage-server", ss.nonceC[:], ss.nonceS[:]); !hmac.Equal(want[:], ch.Proof[:]) {
		_ = writeMsg(c, &wire.Error{Code: wire.CodeAuthFailed, Message: "server proof does not match our token"})
		return fail(codeErr(wire.CodeAuthFailed, "peer %s (%s) failed authentication: its token differs from ours; check security.token on both sides", ch.NodeName, addr))
	}
	if err := writeMsg(c, &wire.Auth{Proof: proof(s.token, "stage-client", ss.nonceC[:], ss.nonceS[:])}); err != nil {
		return fail(fmt.Errorf("send auth: %w", err))
	}
	wel, err := expect[*wire.Welcome](c, "welcome")
	if err != nil {
		if errCode(err) == wire.CodeAuthFailed {
			return fail(codeErr(wire.CodeAuthFailed, "peer %s (%s) refused our token; check security.token on both sides", ch.NodeName, addr))
		}
		return fail(err)
	}
	ss.sid, ss.peerName, ss.peerHost = wel.SessionID, ch.NodeName, ch.HostID
	ss.chunkSize = min(int(s.cfg.Staging.SlotSize), int(wel.SlotSize))
	ss.peerWindow = wel.Window
	if n := int(wel.MaxStreams); n < ss.streams.stripes {
		ss.streams.stripes, ss.streams.list = n, ss.streams.list[:n] // not shared yet
	}
	if !stop() {
		return fail(fmt.Errorf("handshake with %s: %w", addr, ctx.Err()))
	}
	_ = c.SetDeadline(time.Time{})
	for i := 0; i < ss.streams.stripes; i++ {
		dc, err := hs.dialData(ctx, ss, addr, uint16(i), r.Conf().ConnectTimeout)
		if err != nil {
			ss.streams.stop()
			return fail(fmt.Errorf("data stream %d: %w", i, err))
		}
		ss.attach(i, dc, nil)
	}
	if err := hs.register(ss, c); err != nil {
		ss.streams.stop()
		return fail(err)
	}
	return ss, nil
}

// dialData dials data stream idx of ss at addr and proves it.
func (hs handshaker) dialData(ctx context.Context, ss *session, addr string, idx uint16, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c, err := ss.s.tls.dial(ctx, raw, addr, ss.s.cfg.Limits.HandshakeTimeout)
	if err != nil {
		_ = raw.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(ss.s.cfg.Limits.HandshakeTimeout))
	// A session (or sidecar) closing meanwhile ends the handshake at once.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if err := writeMsg(c, &wire.DataHello{SessionID: ss.sid, Stream: idx, Proof: hs.dataProof(ss, idx)}); err != nil {
		_ = c.Close()
		return nil, err
	}
	if _, err := expect[*wire.DataAccept](c, "data accept"); err != nil {
		_ = c.Close()
		return nil, ss.s.tls.dialErr(addr, err)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// coreUp tells the Sender core of an established session. It runs
// before anything (a data stream attaching, a request) can name the
// session: on the dialing side once every stream is attached, on the
// accepting side before Welcome (sessionTable.enlist).
func coreUp(ss *session) {
	ss.s.sender.post(staging.Event{Kind: staging.EvSessionUp, Session: ss.id, N: ss.streams.count(), Credits: int(ss.peerWindow), Now: time.Now()})
}

// register makes an established session live: the control connection goes
// to gnet, the Sender core learns of it (when enlist did not already), and
// stats, heartbeats and routes see it.
func (hs handshaker) register(ss *session, c net.Conn) error {
	s := hs.s
	if err := s.sessions.promote(ss); err != nil {
		return err
	}
	// An accepted session may have closed while being set up (its last
	// data stream lost): its close removed it from the maps before we
	// added it here (then we see it closed), or removes it after.
	ss.mu.Lock()
	closed, cerr := ss.closed, ss.err
	ss.mu.Unlock()
	if closed {
		s.sessions.remove(ss)
		return fmt.Errorf("session closed while being set up: %w", cerr)
	}
	if tc, ok := c.(*tls.Conn); ok {
		// gnet drives raw sockets only: a TLS session gets goroutines.
		ss.mu.Lock()
		ss.tctl = startTLSControl(ss, tc)
		closed := ss.closed
		ss.mu.Unlock()
		if closed {
			ss.tctl.close()
		}
	} else {
		gc, err := s.gcli.EnrollContext(c, ss)
		if err != nil {
			ss.close(fmt.Errorf("enroll control connection: %w", err))
			return fmt.Errorf("enroll control connection: %w", err)
		}
		ss.mu.Lock()
		ss.gc = gc // the same conn OnOpen stored, if it ran first
		closed := ss.closed
		ss.mu.Unlock()
		if closed {
			_ = gc.Close()
		}
	}
	fields := []zap.Field{zap.String("peer", ss.peerName), zap.String("addr", ss.addr),
		zap.Bool("dialed", ss.dialer), zap.Int("stripes", ss.streams.count()), zap.Int("chunk", ss.chunkSize), zap.Bool("same_node", ss.sameHost())}
	if name := peerCertName(c); name != "" {
		fields = append(fields, zap.String("tls_peer", name))
	}
	s.log.Info("session up", fields...)
	if ss.sameHost() {
		ss.send(&wire.NodeInfo{Socket: s.nodes.Name(), Device: s.dev.String()})
	}
	s.resendTickets(ss)
	return nil
}

// acceptLoop serves the peer listener: each connection opens with Hello
// (a control session) or DataHello (a data stream of one). Connections
// past the pre-authentication bounds are closed at once (preauth.go).
func (hs handshaker) acceptLoop() {
	s := hs.s
	defer s.wg.Done()
	var active sync.WaitGroup
	defer active.Wait()
	for {
		c, err := s.peerLn.Accept()
		if err != nil {
			if s.closing.Load() {
				return
			}
			s.log.Warn("accept peer", zap.Error(err))
			time.Sleep(50 * time.Millisecond)
			continue
		}
		from := sourceAddr(c)
		if reason, ok := s.preauth.admit(from); !ok {
			s.preauth.refuse(c, reason)
			continue
		}
		active.Add(1)
		go func() {
			defer active.Done()
			err := hs.serveConn(c)
			s.preauth.release(from)
			if err != nil {
				s.preauth.log.Warn("refused peer connection", zap.String("remote", c.RemoteAddr().String()), zap.Error(err))
				_ = c.Close()
			}
		}()
	}
}

func (hs handshaker) serveConn(raw net.Conn) error {
	s := hs.s
	_ = raw.SetDeadline(time.Now().Add(s.cfg.Limits.HandshakeTimeout))
	// A shutdown must not wait for a peer that is slow to finish its
	// handshake: expire the deadline at once. The TCP connection's
	// deadline also bounds a TLS connection over it; the watcher keeps
	// its own variable, as c is replaced by the TLS one below.
	hsDone := make(chan struct{})
	defer close(hsDone)
	go func() {
		select {
		case <-s.ctx.Done():
			_ = raw.SetDeadline(time.Now())
		case <-hsDone:
		}
	}()
	c, err := s.tls.accept(s.ctx, raw)
	if err != nil {
		return err
	}
	// The first bytes tell a dialer with security.tls from a plaintext one.
	var hb [wire.HeaderSize]byte
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		return fmt.Errorf("first frame: %w", err)
	}
	if s.tls == nil && looksLikeTLS(hb[:]) {
		_ = writeMsg(c, &wire.Error{Code: wire.CodeAuthFailed, Message: "this peer does not use TLS (no security.tls)"})
		return errors.New("peer opened with a TLS handshake but security.tls is not set here; set security.tls on both sides, or on neither")
	}
	_, m, _, err := wire.ReadFrame(io.MultiReader(bytes.NewReader(hb[:]), c), nil)
	if err != nil {
		return fmt.Errorf("first frame: %w", err)
	}
	switch m := m.(type) {
	case *wire.Hello:
		return hs.acceptSession(c, m)
	case *wire.DataHello:
		return hs.acceptData(c, m)
	default:
		_ = writeMsg(c, &wire.Error{Code: wire.CodeMalformed, Message: "expected Hello or DataHello"})
		return fmt.Errorf("first frame is %s, not Hello or DataHello", m.Type())
	}
}

func (hs handshaker) acceptSession(c net.Conn, h *wire.Hello) error {
	s := hs.s
	if h.VersionMax < wire.VersionMin || h.VersionMin > wire.VersionMax {
		_ = writeMsg(c, &wire.Error{Code: wire.CodeUnsupported, Message: fmt.Sprintf("no common protocol version: peer speaks %d..%d, we speak %d..%d", h.VersionMin, h.VersionMax, wire.VersionMin, wire.VersionMax)})
		return fmt.Errorf("peer %s: no common protocol version", h.NodeName)
	}
	if s.sessions.count() >= s.cfg.Limits.MaxSessions {
		_ = writeMsg(c, &wire.Error{Code: wire.CodeBusy, Message: "too many sessions"})
		return fmt.Errorf("peer %s: limits.max_sessions (%d) reached", h.NodeName, s.cfg.Limits.MaxSessions)
	}
	if h.SlotSize == 0 || h.Window == 0 {
		_ = writeMsg(c, &wire.Error{Code: wire.CodeBadRequest, Message: "slot size and window must be positive"})
		return fmt.Errorf("peer %s: slot size %d, window %d", h.NodeName, h.SlotSize, h.Window)
	}
	ss := s.newSession(false, 0)
	ss.nonceC, ss.peerName, ss.peerHost = h.Nonce, h.NodeName, h.HostID
	ss.addr = c.RemoteAddr().String()
	ss.linkName = wire.InboundLink // one link for all: metrics stay bounded however many peers dial
	ss.link = s.links.get(ss.linkName)
	randBytes(ss.nonceS[:])
	ch := &wire.Challenge{Version: min(h.VersionMax, wire.VersionMax), NodeName: s.cfg.Node.Name, HostID: s.hostID,
		Nonce: ss.nonceS, Proof: proof(s.token, "stage-server", ss.nonceC[:], ss.nonceS[:])}
	fail := func(err error) error { ss.cancel(); return err }
	if err := writeMsg(c, ch); err != nil {
		return fail(err)
	}
	a, err := expect[*wire.Auth](c, "auth")
	if err != nil {
		return fail(err)
	}
	if want := proof(s.token, "stage-client", ss.nonceC[:], ss.nonceS[:]); !hmac.Equal(want[:], a.Proof[:]) {
		_ = writeMsg(c, &wire.Error{Code: wire.CodeAuthFailed, Message: "authentication failed"})
		return fail(fmt.Errorf("peer %s (%s) sent a wrong token proof", h.NodeName, c.RemoteAddr()))
	}
	randBytes(ss.sid[:])
	maxStreams := s.sessions.streamOffer(64)
	if maxStreams == 0 {
		_ = writeMsg(c, &wire.Error{Code: wire.CodeBusy, Message: fmt.Sprintf("too many data streams (limits.max_streams %d)", s.cfg.Limits.MaxStreams)})
		return fail(fmt.Errorf("peer %s: limits.max_streams (%d) reached", h.NodeName, s.cfg.Limits.MaxStreams))
	}
	ss.streams.list = make([]*dataStream, maxStreams) // the dialer picks how many it opens, at most this
	ss.chunkSize = min(int(s.cfg.Staging.SlotSize), int(h.SlotSize))
	ss.peerWindow = h.Window
	// The core learns of each data stream as it attaches (attach grows
	// ss.streams.stripes); streams that never arrive are never chosen.
	ss.streams.stripes = 0
	if err := s.sessions.enlist(ss); err != nil {
		_ = writeMsg(c, &wire.Error{Code: wire.CodeShutdown, Message: err.Error()})
		return fail(err)
	}
	// From here on the session is known: undo it with close, which also
	// tells the core and stops any stream that attached meanwhile.
	if err := writeMsg(c, &wire.Welcome{SessionID: ss.sid, SlotSize: uint32(s.cfg.Staging.SlotSize),
		Window: uint32(s.cfg.Staging.Window), MaxStreams: uint16(maxStreams)}); err != nil {
		err = fmt.Errorf("send welcome: %w", err)
		ss.close(err)
		return err
	}
	_ = c.SetDeadline(time.Time{})
	if err := hs.register(ss, c); err != nil {
		ss.close(err)
		return err
	}
	return nil
}

func (hs handshaker) acceptData(c net.Conn, h *wire.DataHello) error {
	s := hs.s
	ss := s.sessions.accepted(h.SessionID)
	if ss == nil {
		_ = writeMsg(c, &wire.Error{Code: wire.CodeAuthFailed, Message: "unknown session"})
		return errors.New("data stream for an unknown session")
	}
	if want := hs.dataProof(ss, h.Stream); !hmac.Equal(want[:], h.Proof[:]) {
		_ = writeMsg(c, &wire.Error{Code: wire.CodeAuthFailed, Message: "authentication failed"})
		return fmt.Errorf("data stream %d of peer %s: wrong proof", h.Stream, ss.peerName)
	}
	if int(h.Stream) >= len(ss.streams.list) { // fixed once the session is known
		_ = writeMsg(c, &wire.Error{Code: wire.CodeBadRequest, Message: "stream index out of range"})
		return fmt.Errorf("data stream %d of peer %s: index out of range", h.Stream, ss.peerName)
	}
	_ = c.SetDeadline(time.Time{})
	// attach tells the core the stream is up before it answers DataAccept:
	// the dialer may send a request that needs the stream the moment it
	// reads DataAccept.
	if !ss.attach(int(h.Stream), c, &wire.DataAccept{Stream: h.Stream}) {
		return fmt.Errorf("data stream %d of peer %s: already attached or unusable", h.Stream, ss.peerName)
	}
	return nil
}
