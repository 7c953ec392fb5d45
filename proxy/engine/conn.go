// Package engine serves the control socket: one connection per inference
// engine, each a reader goroutine (the only place fds arrive, by
// SCM_RIGHTS) and a writer fed by a bounded queue, with small answers
// written at once by whoever produced them when that queue is empty. What
// a request does is the Backend's business: the sidecar implements it.
// Each connection is an Owner, a group of its own until its first request
// joins one (Join); every request names it, Notify reaches the groups it
// is given, and the Backend hears when a connection ended (Closed).
package engine

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// client is one engine connection on the control socket.
type client struct {
	l     *Listener
	conn  *net.UnixConn
	raw   syscall.RawConn
	out   chan *bytebufferpool.ByteBuffer
	wg    sync.WaitGroup
	once  sync.Once
	dead  chan struct{}
	waits sync.WaitGroup

	// A small answer goes straight out from whoever produced it when the
	// writer has nothing in hand (wmu guards pending, the answers queued
	// or being written by writeLoop), so answers stay in order and the
	// latency path saves a goroutine hand-off.
	wmu     sync.Mutex
	pending int

	// owner is the connection and its group: set when the reader starts,
	// changed only by Join (its first request), under l.mu (Notify reads
	// the group there). started: a request other than Join came (reader
	// only).
	owner   Owner
	started bool

	pieces pieces // requests sent in pieces (conn_pieces.go)

	rwait spin.Adaptive // the reader's polling window: readLoop's alone
}

// conns numbers the control-socket connections of the process.
var conns atomic.Uint64

// ownGroup is the group of a connection that joined none: itself.
func ownGroup(conn uint64) string { return "c:" + strconv.FormatUint(conn, 10) }

// ErrWouldWait is what Backend.Submit returns, with wait false, for a
// transfer that would block.
var ErrWouldWait = errors.New("engine: the transfer would wait for its peer")

// directMax is the largest answer written straight from the producer.
const directMax = 64 << 10

// MaxUnregisterWait bounds how long a confirmed Unregister waits for the
// transfers holding its region, whatever its WaitMs asks (PROTOCOL.md 9.4).
const MaxUnregisterWait = 10 * time.Minute

// unregisterWait is the wait an Unregister's WaitMs asks for, capped.
func unregisterWait(ms uint32) time.Duration {
	return min(time.Duration(ms)*time.Millisecond, MaxUnregisterWait)
}

// clientQueue bounds answers and notifications queued for one client; a
// client that lets it fill is not reading and is disconnected.
const clientQueue = 8192

func (c *client) close() {
	c.once.Do(func() {
		close(c.dead)
		_ = c.conn.Close()
		c.l.mu.Lock()
		delete(c.l.clients, c)
		delete(c.l.subs, c)
		c.l.mu.Unlock()
	})
}

// reply sends or queues a message for the client; it never blocks.
func (c *client) reply(m wire.Msg) {
	buf := bytebufferpool.Get()
	buf.B = wire.AppendFrame(buf.B[:0], m, false, 0)
	c.wmu.Lock()
	if c.pending == 0 && len(buf.B) <= directMax {
		n := c.tryWrite(buf.B)
		if n == len(buf.B) {
			c.wmu.Unlock()
			bytebufferpool.Put(buf)
			return
		}
		buf.B = append(buf.B[:0], buf.B[n:]...) // the writer sends the rest
	}
	c.pending++
	c.wmu.Unlock()
	select {
	case <-c.dead:
		bytebufferpool.Put(buf)
	case c.out <- buf:
	default:
		bytebufferpool.Put(buf)
		c.l.log.Error("control client is not reading its answers; disconnecting it")
		c.close()
	}
}

// tryWrite sends what of b the socket takes now, without blocking; a
// failed socket takes nothing (the writer meets the error).
func (c *client) tryWrite(b []byte) int {
	var n int
	if err := c.raw.Write(func(fd uintptr) bool {
		for {
			k, err := unix.SendmsgN(int(fd), b, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
			if err == unix.EINTR {
				continue
			}
			if err == nil {
				n = k
			}
			return true
		}
	}); err != nil {
		return 0
	}
	return n
}

func (c *client) fail(req uint64, err error) {
	c.reply(&wire.Fail{Req: req, Code: status.Code(err), Message: err.Error()})
}

// answer replies OK to request req, or Fail with err.
func (c *client) answer(req uint64, err error) {
	if err != nil {
		c.fail(req, err)
		return
	}
	c.reply(&wire.OK{Req: req})
}

func (c *client) writeLoop() {
	defer c.l.wg.Done()
	defer c.wg.Done()
	for {
		select {
		case <-c.dead:
			for {
				select {
				case b := <-c.out:
					bytebufferpool.Put(b)
				default:
					return
				}
			}
		case b := <-c.out:
			_, err := c.conn.Write(b.B)
			bytebufferpool.Put(b)
			c.wmu.Lock()
			c.pending--
			c.wmu.Unlock()
			if err != nil {
				c.close()
			}
		}
	}
}

func (c *client) readLoop() {
	n := conns.Add(1)
	c.l.mu.Lock()
	c.owner = Owner{Conn: n, Group: ownGroup(n)}
	c.l.mu.Unlock()
	defer c.l.wg.Done()
	defer c.wg.Done()
	// Once every request is answered: what the connection registered goes.
	defer func() { c.l.b.Closed(c.owner) }()
	defer c.waits.Wait()
	defer c.closePieces()
	defer c.close()
	var buf []byte
	c.rwait = c.l.readSpin.New()
	for {
		var (
			h   wire.Header
			m   wire.Msg
			fd  int
			err error
		)
		spin.Await(c.conn, &c.rwait)
		h, m, fd, buf, err = unixsock.ReadFrame(c.conn, buf)
		var bad *unixsock.BadRequest
		if errors.As(err, &bad) && bad.Req != 0 {
			code := wire.CodeMalformed
			if errors.Is(bad.Err, wire.ErrOverflow) {
				code = wire.CodeOutOfRange
			}
			c.reply(&wire.Fail{Req: bad.Req, Code: code, Message: bad.Err.Error()})
			if h.Type == wire.TypeSubmitMore {
				c.badPiece(bad.Req, status.Errorf(code, "a piece of request %d did not decode: %v", bad.Req, bad.Err))
			}
			continue
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.l.log.Warn("control client sent a bad frame; disconnecting it", zap.Error(err))
				c.reply(&wire.Fail{Code: wire.CodeMalformed, Message: err.Error()})
				time.Sleep(10 * time.Millisecond) // let the answer go out
			}
			return
		}
		c.handle(m, fd)
	}
}

func (c *client) handle(m wire.Msg, fd int) {
	b, o := c.l.b, c.owner
	if j, ok := m.(*wire.Join); ok {
		unixsock.CloseFD(fd)
		c.join(j)
		return
	}
	c.started = true
	switch m := m.(type) {
	case *wire.Register:
		err := b.Register(o, m, fd)
		unixsock.CloseFD(fd) // the import keeps what it needs
		if err != nil {
			c.fail(m.Req, err)
			return
		}
		c.reply(&wire.OK{Req: m.Req})
		return
	case *wire.RegisterKV:
		c.answer(m.Req, b.RegisterKV(o, m))
	case *wire.Grant:
		c.answer(m.Req, b.Grant(o, m))
	case *wire.RevokeGrant:
		c.answer(m.Req, b.RevokeGrant(o, m))
	case *wire.SubmitKV:
		// The first KV transfer to a peer's cache waits for its shape (one
		// round trip): answered aside, so the client's other requests go on.
		c.waits.Add(1)
		go func() {
			defer c.waits.Done()
			x, err := b.SubmitKV(o, m)
			if err != nil {
				c.fail(m.Req, err)
				return
			}
			c.reply(&wire.Submitted{Req: m.Req, Transfer: x.ID()})
		}()
	case *wire.Unregister:
		if m.WaitMs == 0 {
			if err := b.Unregister(o, m.Name); err != nil {
				c.fail(m.Req, err)
			} else {
				c.reply(&wire.OK{Req: m.Req})
			}
			break
		}
		// A confirmed unregister waits for the region's transfers: answered
		// aside, so the client's other requests go on.
		c.waits.Add(1)
		go func() {
			defer c.waits.Done()
			if err := b.UnregisterWait(o, m.Name, unregisterWait(m.WaitMs), c.dead); err != nil {
				c.fail(m.Req, err)
			} else {
				c.reply(&wire.OK{Req: m.Req})
			}
		}()
	case *wire.Submit:
		c.submit(m, false)
	case *wire.SubmitWait:
		c.submit(&m.Submit, true)
	case *wire.SubmitHead:
		c.submitHead(m)
	case *wire.SubmitMore:
		c.submitMore(m)
	case *wire.Status:
		x, err := b.Lookup(o, m.Transfer)
		if err != nil {
			c.fail(m.Req, err)
			return
		}
		c.reply(x.Status(m.Req))
	case *wire.Wait:
		x, err := b.Lookup(o, m.Transfer)
		if err != nil {
			c.fail(m.Req, err)
			return
		}
		c.waits.Add(1)
		go func() {
			defer c.waits.Done()
			var timeout <-chan time.Time
			if m.TimeoutMs > 0 {
				t := time.NewTimer(time.Duration(m.TimeoutMs) * time.Millisecond)
				defer t.Stop()
				timeout = t.C
			}
			select {
			case <-x.Done():
			case <-timeout:
			case <-c.dead:
				return
			}
			c.reply(x.Status(m.Req))
		}()
	case *wire.Cancel:
		if err := b.Cancel(o, m.Transfer); err != nil {
			c.fail(m.Req, err)
		} else {
			c.reply(&wire.OK{Req: m.Req})
		}
	case *wire.Subscribe:
		c.l.mu.Lock()
		c.l.subs[c] = struct{}{}
		c.l.mu.Unlock()
		c.reply(&wire.OK{Req: m.Req})
	case *wire.OpenInbox, *wire.PostTicket, *wire.TakeTickets:
		c.tickets(m)
	case *wire.Query:
		answer := func() {
			js, err := b.Query(o, m)
			if err != nil {
				c.fail(m.Req, err)
				return
			}
			c.reply(&wire.QueryReply{Req: m.Req, JSON: js})
		}
		if m.What != wire.QueryCatalog {
			answer()
			break
		}
		// A catalog waits for the peer: answer it aside so the client's
		// other requests are not held up.
		c.waits.Add(1)
		go func() {
			defer c.waits.Done()
			answer()
		}()
	default:
		unixsock.CloseFD(fd)
		c.fail(reqOf(m), status.Errorf(wire.CodeBadRequest, "%s is not a request", m.Type()))
		return
	}
	unixsock.CloseFD(fd)
}

// submit starts a transfer and answers Submitted, or with untilDone
// (SubmitWait) its final status. A transfer that has to wait for a
// session to its peer is started aside, so one submit to a peer that is
// still connecting does not hold up the engine's requests to others.
func (c *client) submit(m *wire.Submit, untilDone bool) {
	answer := func(x Transfer, err error) {
		switch {
		case err != nil:
			c.fail(m.Req, err)
		case untilDone:
			// Answered from whoever finishes the transfer; reply never blocks.
			x.WhenDone(func() { c.reply(x.Status(m.Req)) })
		default:
			c.reply(&wire.Submitted{Req: m.Req, Transfer: x.ID()})
		}
	}
	x, err := c.l.b.Submit(c.owner, m, false)
	if !errors.Is(err, ErrWouldWait) {
		answer(x, err)
		return
	}
	c.waits.Add(1)
	go func() {
		defer c.waits.Done()
		answer(c.l.b.Submit(c.owner, m, true))
	}()
}

// tickets serves the ticket requests (PROTOCOL.md 9.19): a post, which
// waits for the peer, and a take that waits for a ticket are answered
// aside, so the client's other requests go on.
func (c *client) tickets(m wire.Msg) {
	b, o := c.l.b, c.owner
	switch m := m.(type) {
	case *wire.OpenInbox:
		if err := b.OpenInbox(o, m); err != nil {
			c.fail(m.Req, err)
		} else {
			c.reply(&wire.OK{Req: m.Req})
		}
	case *wire.PostTicket:
		c.aside(func() {
			if err := b.PostTicket(o, m); err != nil {
				c.fail(m.Req, err)
			} else {
				c.reply(&wire.OK{Req: m.Req})
			}
		})
	case *wire.TakeTickets:
		c.aside(func() { c.reply(&wire.Tickets{Req: m.Req, Items: b.TakeTickets(o, m, c.dead)}) })
	}
}

// aside runs f on a goroutine of its own that Close waits for.
func (c *client) aside(f func()) {
	c.waits.Add(1)
	go func() {
		defer c.waits.Done()
		f()
	}()
}

// join puts the connection into a group: only as its first request, with
// a token long enough not to be guessed.
func (c *client) join(m *wire.Join) {
	switch {
	case c.started:
		c.fail(m.Req, status.Errorf(wire.CodeBadRequest, "Join must be the connection's first request (before any Register, Submit, Subscribe or Query): open a new connection and join first"))
		return
	case len(m.Group) < wire.MinGroup:
		c.fail(m.Req, status.Errorf(wire.CodeBadRequest, "group token of %d bytes: it needs at least %d (a secret the group's processes share, such as 16 random bytes)", len(m.Group), wire.MinGroup))
		return
	}
	c.started = true
	c.l.mu.Lock()
	c.owner.Group = "g:" + string(m.Group)
	c.l.mu.Unlock()
	c.reply(&wire.OK{Req: m.Req})
}

// reqOf finds the request id of any local message (they all start with it).
func reqOf(m wire.Msg) uint64 {
	b := m.AppendBody(nil)
	if len(b) >= 8 {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}
