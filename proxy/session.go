package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/node"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// session is an authenticated control session with one peer: the link
// (the control connection, its liveness and lifecycle, send) and its
// data streams. What moves on it lives in its two halves, each with a
// lock of its own: in (inbound, recv_inbound.go), the transfers landing
// here and the receive core that decides about them, and out
// (answerTable, send_answertable.go), the transfers whose chunks we send
// (our pushes, the pulls we serve) as the peer's answers name them. The
// sender core's own state stays in the core.
//
// Lock order. Each lock of a session is a leaf: session.mu (the link's
// connection and lifecycle), in.mu, out.mu, streams.mu and those of its
// waiting requests (asks.go) are each held only around their own fields
// (or the pure receive core), never while another lock is taken; frames
// are sent, transfers finished and the sender core told after letting
// go. So no order between them can be broken. A step that spans them
// (close, a small push, a served pull) takes them one after the other:
// close marks the link closed first, then each half (in: RxClose; out:
// close; streams: stop), and each half refuses on its own what may not
// start on a closed session.
type session struct {
	s        *Server
	id       uint64 // local; the Sender core's session key
	sid      [wire.SessionIDSize]byte
	dialer   bool // we dialed: our transfer ids are odd
	peerName string
	peerHost string
	addr     string // as dialed (a route's peer address), or the dialer's
	remote   string // ip:port the dialed session reached
	route    *route // nil when the peer dialed us
	link     *counters
	linkName string

	nonceC, nonceS [wire.NonceSize]byte
	chunkSize      int
	peerWindow     uint32 // credits the peer granted us

	in      *inbound     // the receiving half (recv_inbound.go)
	out     *answerTable // the sending half as the peer's answers see it (send_answertable.go)
	streams streamSet    // the data streams (streams.go)
	node    *node.Peer   // same-node paths (proxy/node)
	// recvShare: the receive slots its streams' readers hold, for the
	// fair shares among peers (staging.Pool.AcquireAs).
	recvShare staging.Tenant
	watched   []*dataStream // the stall watchdog's reused copy of streams (loop goroutine)

	// infoParked counts the peer's KVInfoRequests held for a cache not
	// registered yet, pullParked its KVPulls held for their grant
	// (kvpark.go).
	infoParked, pullParked atomic.Int32
	// ticketsParked counts the peer's tickets held for an inbox not open
	// yet (kvpark.go)
	ticketsParked atomic.Int32

	catalogs waiting[[]wire.RegionInfo]  // our CatalogRequests waiting for their answers, by Seq
	tickets  waiting[*wire.TicketAnswer] // our Tickets waiting for their answers, by Seq (tickets.go)

	lastRecv atomic.Int64  // unix nanos of the last control frame from the peer
	lastSent atomic.Int64  // unix nanos of the last control frame to the peer
	ready    chan struct{} // closed when every data stream is attached

	mu     sync.Mutex     // guards the link: gc, tctl, sent, closed, err
	gc     gnet.Conn      // the control connection on gnet (plaintext)
	tctl   *tlsControl    // or over TLS (security.tls)
	sent   func(wire.Msg) // tests only: sees every frame send queues
	closed bool
	err    error
	done   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
}

func (s *Server) newSession(dialer bool, stripes int) *session {
	ss := &session{s: s, id: s.newID(), dialer: dialer, out: newAnswerTable(), done: make(chan struct{}), ready: make(chan struct{})}
	ss.in = newInbound(ss, s.cfg.Limits.MaxTransfersPerPeer)
	ss.streams.list, ss.streams.stripes = make([]*dataStream, stripes), stripes
	ss.ctx, ss.cancel = context.WithCancel(s.ctx)
	ss.node = s.nodes.NewPeer(nodeSession{ss})
	now := time.Now().UnixNano()
	ss.lastRecv.Store(now)
	ss.lastSent.Store(now)
	return ss
}

// wireID turns a local transfer id into this session's wire id: the side
// that dialed uses odd ids, the side that accepted even ones.
func (ss *session) wireID(local uint64) uint64 {
	if ss.dialer {
		return local<<1 | 1
	}
	return local << 1
}

// ours reports whether a wire id was allocated by this side.
func (ss *session) ours(wireID uint64) bool { return (wireID&1 == 1) == ss.dialer }

// send encodes m and queues it on the control connection.
func (ss *session) send(m wire.Msg) {
	ss.mu.Lock()
	gc, tctl, closed, sent := ss.gc, ss.tctl, ss.closed, ss.sent
	ss.mu.Unlock()
	if sent != nil {
		sent(m)
	}
	if (gc == nil && tctl == nil) || closed {
		return
	}
	ss.lastSent.Store(time.Now().UnixNano())
	buf := bytebufferpool.Get()
	if tctl != nil {
		buf.B = wire.AppendFrame(buf.B[:0], m, false, 0)
		tctl.write(buf.B)
		bytebufferpool.Put(buf)
		return
	}
	buf.B = wire.AppendFrame(buf.B[:0], m, false, 0)
	if err := gc.AsyncWrite(buf.B, func(_ gnet.Conn, _ error) error {
		bytebufferpool.Put(buf)
		return nil
	}); err != nil {
		bytebufferpool.Put(buf)
	}
}

// close tears the session down once: streams closed, transfers on it failed.
func (ss *session) close(err error) {
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return
	}
	ss.closed, ss.err = true, err
	gc, tctl := ss.gc, ss.tctl
	ss.mu.Unlock()
	perr := codeErr(wire.CodePeerUnavailable, "session with %s (%s) closed: %w", ss.peerName, ss.addr, err)
	var in recvOut // the incoming transfers failed, performed below
	ss.in.close(perr, &in)
	ss.out.close()
	ss.cancel()
	if gc != nil {
		_ = gc.Close()
	}
	if tctl != nil {
		tctl.close()
	}
	ss.streams.stop()
	ss.node.Shut()
	s := ss.s
	s.sessions.remove(ss)
	s.sessionGone(ss)
	s.kv.forgetSession(ss.id)
	ss.in.perform(&in)
	s.inline.fail(ss, perr, nil)
	s.sender.post(staging.Event{Kind: staging.EvSessionDown, Session: ss.id, Err: perr, Now: time.Now()})
	close(ss.done)
	s.log.Info("session down", zap.String("peer", ss.peerName), zap.String("addr", ss.addr), zap.Error(err))
}

// Liveness of control sessions: a side that has sent nothing for
// heartbeatEvery sends a Heartbeat, so a peer that hears nothing for
// limits.session_silence (at least two heartbeats) is gone (dead,
// stopped, or behind a half-open connection) and the session is closed,
// failing its transfers at once rather than at their progress deadlines.
const heartbeatEvery = time.Second

// tick runs on the sender loop's tick: deadlines of incoming transfers,
// the stall watchdog, inline pushes unanswered, heartbeats.
func (ss *session) tick(now time.Time) {
	ss.in.tick(now)
	ss.watchStreams(now)
	ss.s.inline.expire(ss, now)
	ss.keepAlive(now)
}

// keepAlive runs on the sender loop's tick.
func (ss *session) keepAlive(now time.Time) {
	if silent := now.Sub(time.Unix(0, ss.lastRecv.Load())); silent > ss.s.cfg.Limits.SessionSilence {
		ss.close(fmt.Errorf("peer silent for %v (no heartbeat): dead, stopped, or the connection is half-open", silent.Round(time.Millisecond)))
		return
	}
	ss.node.Expire(now)
	if now.Sub(time.Unix(0, ss.lastSent.Load())) >= heartbeatEvery {
		ss.send(&wire.Heartbeat{Seq: uint64(now.UnixNano()), UnixNanos: now.UnixNano()})
	}
}

// closeLater closes ss on a goroutine of its own, for callers that must
// not wait for it (gnet's event loop, a control connection's writer) or
// may hold locks close takes.
func (ss *session) closeLater(err error) { ss.s.closers.run(func() { ss.close(err) }) }

// closerGroup holds the goroutines of closeLater. Close waits for them
// after gnet's loops stopped, the last that start one; once it has, none
// starts: Close closed every session before.
type closerGroup struct {
	mu   sync.Mutex
	wg   sync.WaitGroup
	done bool // wait ran: no more start
}

func (g *closerGroup) run(f func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done {
		return
	}
	g.wg.Go(f)
}

// wait waits for the goroutines started and lets no more start.
func (g *closerGroup) wait() {
	g.mu.Lock()
	g.done = true
	g.mu.Unlock()
	g.wg.Wait()
}

// askCatalog asks the peer of ss for its regions (stagectl's catalog
// query), as seq.
func askCatalog(ss *session, seq uint64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	regs, err := ask(ctx, ss, &ss.catalogs, seq, &wire.CatalogRequest{Seq: seq})
	switch {
	case err == errAskGone:
		return nil, codeErr(wire.CodePeerUnavailable, "session with %s closed", ss.peerName)
	case err != nil:
		return nil, codeErr(wire.CodeTimeout, "peer %s did not answer the catalog request in 5s", ss.peerName)
	}
	return json.Marshal(regs)
}
