package engine

import (
	"time"

	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// The bookkeeping of a connection's requests sent in pieces (PROTOCOL.md
// 9.5b): which are open, how many pieces and ops each has had, when its
// End is due. Pure: no I/O, no clock (the caller passes now); the
// connection holds it under its own lock and does what it decides.

// pieceLimits bound one connection's requests in pieces.
type pieceLimits struct {
	pieces int           // pieces of one request, SubmitHead and End included
	ops    int           // ops of one request, all pieces together
	rest   time.Duration // from SubmitHead to End
	open   int           // requests open at once
}

// wireLimits are the limits PROTOCOL.md states (and QueryFeatures says).
var wireLimits = pieceLimits{pieces: wire.MaxSubmitPieces, ops: wire.MaxOps,
	rest: wire.SubmitRestMs * time.Millisecond, open: wire.SubmitOpenMax}

// pieceBook is the open requests of one connection.
type pieceBook struct {
	lim  pieceLimits
	open map[uint64]*pieceEntry
}

// pieceEntry is one open request.
type pieceEntry struct {
	pieces, ops int
	due         time.Time
	// failed: refused or failed after its head; the rest of its pieces
	// are taken and dropped, unanswered (the request was answered once).
	failed bool
}

// pieceVerdict says what to do with a SubmitMore that passed the book.
type pieceVerdict uint8

const (
	pieceGrow pieceVerdict = iota + 1 // hand its ops to the transfer
	pieceDrop                         // its request failed already: drop it, answer nothing
)

func newPieceBook(lim pieceLimits) *pieceBook {
	return &pieceBook{lim: lim, open: map[uint64]*pieceEntry{}}
}

// head opens request req with its first piece of ops ops. On error nothing
// is opened, and the caller answers the head with it.
func (b *pieceBook) head(req uint64, ops int, now time.Time) error {
	switch {
	case b.open[req] != nil:
		return status.Errorf(wire.CodeBadRequest, "request %d: a request in pieces with this id is open already; use a new Req for each request", req)
	case len(b.open) >= b.lim.open:
		return status.Errorf(wire.CodeBusy, "request %d: %d requests in pieces are open on this connection, the most it may have; wait for one to end (its End), or send this one whole", req, b.lim.open)
	case ops > b.lim.ops:
		return status.Errorf(wire.CodeBadRequest, "request %d: %d ops in its SubmitHead, more than %d", req, ops, b.lim.ops)
	}
	b.open[req] = &pieceEntry{pieces: 1, ops: ops, due: now.Add(b.lim.rest)}
	return nil
}

// more takes a SubmitMore of req with ops ops (end: the last). An error
// fails the request: the caller aborts its transfer (or, for a request
// that was never opened, answers the piece with it). End, or an error,
// closes the request.
func (b *pieceBook) more(req uint64, ops int, end bool) (pieceVerdict, error) {
	e := b.open[req]
	if e == nil {
		return 0, status.Errorf(wire.CodeBadRequest, "SubmitMore for request %d, which has no open request in pieces (no SubmitHead sent, or its End came, or its %v passed)", req, b.lim.rest)
	}
	if end {
		delete(b.open, req)
	}
	if e.failed {
		return pieceDrop, nil
	}
	e.pieces++
	if e.pieces > b.lim.pieces {
		e.failed = !end
		return 0, status.Errorf(wire.CodeBadRequest, "request %d: more than %d pieces; send fewer, larger pieces", req, b.lim.pieces)
	}
	if ops > b.lim.ops-e.ops {
		e.failed = !end
		return 0, status.Errorf(wire.CodeBadRequest, "request %d: its pieces carry more than %d ops", req, b.lim.ops)
	}
	e.ops += ops
	return pieceGrow, nil
}

// failed marks req failed (its transfer failed, or its head was refused
// by the backend), when it is open.
func (b *pieceBook) failed(req uint64) {
	if e := b.open[req]; e != nil {
		e.failed = true
	}
}

// expire closes the requests whose End is overdue at now and returns
// those that had not failed: the caller aborts their transfers.
func (b *pieceBook) expire(now time.Time) (late []uint64) {
	for req, e := range b.open {
		if now.Before(e.due) {
			continue
		}
		delete(b.open, req)
		if !e.failed {
			late = append(late, req)
		}
	}
	return late
}

// next is when the earliest open request is due; zero when none is open.
func (b *pieceBook) next() time.Time {
	var t time.Time
	for _, e := range b.open {
		if t.IsZero() || e.due.Before(t) {
			t = e.due
		}
	}
	return t
}

// closeAll closes every open request and returns those that had not
// failed (the connection ended).
func (b *pieceBook) closeAll() (live []uint64) {
	for req, e := range b.open {
		if !e.failed {
			live = append(live, req)
		}
	}
	clear(b.open)
	return live
}
