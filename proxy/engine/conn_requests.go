package engine

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// What each request of an engine connection does, by family; conn.go
// reads the requests and writes the answers. A request that may wait (for
// a peer, a transfer or a region's transfers) is answered aside, so the
// client's other requests go on.

// ErrWouldWait is what Backend.Submit returns, with wait false, for a
// transfer that would block.
var ErrWouldWait = errors.New("engine: the transfer would wait for its peer")

// MaxUnregisterWait bounds how long a confirmed Unregister waits for the
// transfers holding its region, whatever its WaitMs asks (PROTOCOL.md 9.4).
const MaxUnregisterWait = 10 * time.Minute

// unregisterWait is the wait an Unregister's WaitMs asks for, capped.
func unregisterWait(ms uint32) time.Duration {
	return min(time.Duration(ms)*time.Millisecond, MaxUnregisterWait)
}

// handle serves one request. An fd came with it only for Register, which
// closes it itself; any other is closed once the request is served.
func (c *client) handle(m wire.Msg, fd int) {
	if j, ok := m.(*wire.Join); ok {
		unixsock.CloseFD(fd)
		c.join(j)
		return
	}
	c.started = true
	switch m := m.(type) {
	case *wire.Register:
		c.register(m, fd)
		return
	case *wire.RegisterKV, *wire.Grant, *wire.RevokeGrant, *wire.Unregister:
		c.regions(m)
	case *wire.Submit:
		c.submit(m, false)
	case *wire.SubmitWait:
		c.submit(&m.Submit, true)
	case *wire.SubmitHead:
		c.submitHead(m)
	case *wire.SubmitMore:
		c.submitMore(m)
	case *wire.SubmitKV:
		c.submitKV(m)
	case *wire.Status, *wire.Wait, *wire.Cancel:
		c.transfers(m)
	case *wire.Subscribe:
		c.l.mu.Lock()
		c.l.subs[c] = struct{}{}
		c.l.mu.Unlock()
		c.reply(&wire.OK{Req: m.Req})
	case *wire.Query:
		c.query(m)
	case *wire.OpenInbox, *wire.PostTicket, *wire.TakeTickets:
		c.tickets(m)
	default:
		unixsock.CloseFD(fd)
		c.fail(reqOf(m), status.Errorf(wire.CodeBadRequest, "%s is not a request", m.Type()))
		return
	}
	unixsock.CloseFD(fd)
}

// register is the one request whose fd is used: the backend imports what
// it needs of it before the fd is closed.
func (c *client) register(m *wire.Register, fd int) {
	err := c.l.b.Register(c.owner, m, fd)
	unixsock.CloseFD(fd) // the import keeps what it needs
	c.answer(m.Req, err)
}

// regions serves the requests on registered memory besides Register. A
// confirmed Unregister waits for the region's transfers and a RevokeGrant
// for those under its key, so they go aside.
func (c *client) regions(m wire.Msg) {
	b, o := c.l.b, c.owner
	switch m := m.(type) {
	case *wire.RegisterKV:
		c.answer(m.Req, b.RegisterKV(o, m))
	case *wire.Grant:
		c.answer(m.Req, b.Grant(o, m))
	case *wire.RevokeGrant:
		// It waits for the peer transfers admitted under the key to let go
		// (up to seconds): the engine's other calls must not queue behind.
		c.aside(func() { c.answer(m.Req, b.RevokeGrant(o, m)) })
	case *wire.Unregister:
		if m.WaitMs == 0 {
			c.answer(m.Req, b.Unregister(o, m.Name))
			return
		}
		c.aside(func() { c.answer(m.Req, b.UnregisterWait(o, m.Name, unregisterWait(m.WaitMs), c.dead)) })
	}
}

// submitKV starts a KV transfer aside: the first one to a peer's cache
// waits for its shape (one round trip).
func (c *client) submitKV(m *wire.SubmitKV) {
	b, o := c.l.b, c.owner
	c.aside(func() {
		x, err := b.SubmitKV(o, m)
		if err != nil {
			c.fail(m.Req, err)
			return
		}
		c.reply(&wire.Submitted{Req: m.Req, Transfer: x.ID()})
	})
}

// transfers serves the requests on a transfer already started. A Wait is
// answered aside, when the transfer ends or its timeout fires; a client
// gone meanwhile gets nothing.
func (c *client) transfers(m wire.Msg) {
	b, o := c.l.b, c.owner
	switch m := m.(type) {
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
		c.aside(func() {
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
		})
	case *wire.Cancel:
		c.answer(m.Req, b.Cancel(o, m.Transfer))
	}
}

// query answers a Query; a catalog waits for the peer, so it goes aside.
func (c *client) query(m *wire.Query) {
	b, o := c.l.b, c.owner
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
		return
	}
	c.aside(answer)
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
