package engine

import (
	"errors"
	"sync"
	"time"

	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// A connection's requests sent in pieces (PROTOCOL.md 9.5b): the book
// (pieces.go) decides, this file does what it says. The head is admitted
// by the backend like a Submit (aside when it would wait); pieces that
// arrive meanwhile wait in the request's sink, in order, and go to its
// Grower once there is one.

// pieceSink is where one open request's pieces go.
type pieceSink struct {
	req   uint64
	timer *time.Timer // fires at the request's deadline

	mu      sync.Mutex
	g       Grower // nil while the head is being admitted
	pending []pendingPiece
	dead    bool  // aborted, failed or refused: takes nothing more
	abort   error // an abort that came while the head was being admitted
}

type pendingPiece struct {
	ops []wire.LocalOp
	end bool
}

// pieces is a connection's share: its book and the open requests' sinks.
type pieces struct {
	mu    sync.Mutex
	book  *pieceBook
	sinks map[uint64]*pieceSink
}

// submitHead opens a request in pieces and has the backend admit its head.
func (c *client) submitHead(m *wire.SubmitHead) {
	p := &c.pieces
	p.mu.Lock()
	if p.book == nil {
		p.book, p.sinks = newPieceBook(wireLimits), map[uint64]*pieceSink{}
	}
	if err := p.book.head(m.Req, len(m.Ops), time.Now()); err != nil {
		p.mu.Unlock()
		c.fail(m.Req, err)
		return
	}
	sk := &pieceSink{req: m.Req}
	sk.timer = time.AfterFunc(p.book.lim.rest, c.expirePieces)
	p.sinks[m.Req] = sk
	p.mu.Unlock()
	x, g, err := c.l.b.SubmitHead(c.owner, m, false)
	if !errors.Is(err, ErrWouldWait) {
		c.headAdmitted(m, sk, x, g, err)
		return
	}
	c.aside(func() {
		x, g, err := c.l.b.SubmitHead(c.owner, m, true)
		c.headAdmitted(m, sk, x, g, err)
	})
}

// headAdmitted answers the head as Submit or SubmitWait would be answered
// and hands the Grower what came meanwhile.
func (c *client) headAdmitted(m *wire.SubmitHead, sk *pieceSink, x Transfer, g Grower, err error) {
	if err != nil {
		c.fail(m.Req, err)
		c.pieceFailed(sk)
		return
	}
	if m.Wait {
		x.WhenDone(func() { c.reply(x.Status(m.Req)) })
	} else {
		c.reply(&wire.Submitted{Req: m.Req, Transfer: x.ID()})
	}
	sk.mu.Lock()
	sk.g = g
	pend := sk.pending
	sk.pending = nil
	if sk.abort != nil {
		sk.dead = true
		g.Abort(sk.abort)
	}
	failed := false
	for _, pc := range pend {
		if sk.dead {
			break
		}
		if g.Grow(pc.ops, pc.end) != nil {
			sk.dead, failed = true, true
		}
	}
	sk.mu.Unlock()
	if failed {
		c.pieceFailed(sk)
	}
}

// submitMore takes the next piece of a request.
func (c *client) submitMore(m *wire.SubmitMore) {
	p := &c.pieces
	p.mu.Lock()
	if p.book == nil {
		p.book, p.sinks = newPieceBook(wireLimits), map[uint64]*pieceSink{}
	}
	v, err := p.book.more(m.Req, len(m.Ops), m.End)
	sk := p.sinks[m.Req]
	if _, open := p.book.open[m.Req]; !open && sk != nil {
		delete(p.sinks, m.Req)
		sk.timer.Stop()
	}
	p.mu.Unlock()
	switch {
	case err != nil && sk == nil:
		c.fail(m.Req, err) // a stray piece: answered, as any bad request is
	case err != nil:
		sk.fail(err)
	case v == pieceGrow:
		if !sk.give(m.Ops, m.End) {
			c.pieceFailed(sk)
		}
	}
}

// give hands a piece on (or keeps it until the head is admitted); false
// when the transfer failed on it.
func (sk *pieceSink) give(ops []wire.LocalOp, end bool) bool {
	sk.mu.Lock()
	defer sk.mu.Unlock()
	switch {
	case sk.dead:
		return true
	case sk.g == nil:
		sk.pending = append(sk.pending, pendingPiece{ops, end})
		return true
	case sk.g.Grow(ops, end) != nil:
		sk.dead = true
		return false
	}
	return true
}

// fail aborts the request's transfer with err: at once, or as soon as its
// head is admitted.
func (sk *pieceSink) fail(err error) {
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if sk.dead {
		return
	}
	if sk.g == nil {
		if sk.abort == nil {
			sk.abort = err
		}
		return
	}
	sk.dead = true
	sk.g.Abort(err)
}

// pieceFailed marks the request failed in the book: the rest of its
// pieces are dropped.
func (c *client) pieceFailed(sk *pieceSink) {
	sk.mu.Lock()
	sk.dead = true
	sk.pending = nil
	sk.mu.Unlock()
	c.pieces.mu.Lock()
	if c.pieces.book != nil {
		c.pieces.book.failed(sk.req)
	}
	c.pieces.mu.Unlock()
}

// badPiece fails open request req, one of whose pieces did not decode
// (answered Fail already): the rest of its pieces are dropped.
func (c *client) badPiece(req uint64, err error) {
	p := &c.pieces
	p.mu.Lock()
	sk := p.sinks[req]
	if sk == nil {
		p.mu.Unlock()
		return
	}
	p.book.failed(req)
	p.mu.Unlock()
	sk.fail(err)
}

// expirePieces fails the requests whose End is overdue.
func (c *client) expirePieces() {
	p := &c.pieces
	p.mu.Lock()
	late := p.book.expire(time.Now())
	sinks := p.takeSinks(late)
	p.mu.Unlock()
	for _, sk := range sinks {
		sk.fail(status.Errorf(wire.CodeTimeout, "request %d: its End did not come within %v of its SubmitHead; send the rest of its pieces sooner", sk.req, p.book.lim.rest))
	}
}

// closePieces fails every open request: the connection ended before their End.
func (c *client) closePieces() {
	p := &c.pieces
	p.mu.Lock()
	if p.book == nil {
		p.mu.Unlock()
		return
	}
	sinks := p.takeSinks(p.book.closeAll())
	for _, sk := range p.sinks {
		sk.timer.Stop()
	}
	clear(p.sinks)
	p.mu.Unlock()
	for _, sk := range sinks {
		sk.fail(status.Errorf(wire.CodeCancelled, "request %d: the engine's connection closed before its End", sk.req))
	}
}

// takeSinks removes the sinks of reqs (p.mu held) and stops their timers.
func (p *pieces) takeSinks(reqs []uint64) []*pieceSink {
	var out []*pieceSink
	for _, r := range reqs {
		if sk := p.sinks[r]; sk != nil {
			sk.timer.Stop()
			delete(p.sinks, r)
			out = append(out, sk)
		}
	}
	// Sinks of requests the book closed as failed go too.
	for r, sk := range p.sinks {
		if _, open := p.book.open[r]; !open {
			sk.timer.Stop()
			delete(p.sinks, r)
		}
	}
	return out
}
