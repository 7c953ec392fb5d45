package engine

import (
	"time"

	"github.com/stage-kv/stage/wire"
)

// Owner is who makes a request: the connection (Conn, unique in the
// process) and its group. A connection is a group of its own ("c:" and
// its number) until it joins one with a Join frame ("g:" and the token);
// what it registers and submits belongs to it, and every connection of
// its group may use, check, cancel and hear of it (PROTOCOL.md 9.18).
type Owner struct {
	Conn  uint64
	Group string
}

// Backend is what engines' requests do; the sidecar implements it. Its
// methods answer at once, except SubmitKV and a catalog Query, which may
// wait for a peer (the connection answers those aside). Every request
// carries its Owner: the backend refuses what names another group's
// regions, KV caches or transfers.
type Backend interface {
	Register(o Owner, m *wire.Register, fd int) error // fd: the frame's SCM_RIGHTS fd, -1 when none; it stays the caller's
	RegisterKV(o Owner, m *wire.RegisterKV) error
	// Grant and RevokeGrant change which peer requests may read or write
	// blocks of o's KV cache (PROTOCOL.md 9.20).
	Grant(o Owner, m *wire.Grant) error
	RevokeGrant(o Owner, m *wire.RevokeGrant) error
	Unregister(o Owner, name string) error
	// UnregisterWait removes a region once nothing uses it any more and
	// its import is closed, waiting up to wait (or until cancel closes) for
	// the transfers holding it; it blocks, so the connection calls it aside.
	UnregisterWait(o Owner, name string, wait time.Duration, cancel <-chan struct{}) error
	// Submit starts a transfer. With wait false it must not block: when
	// the transfer has to wait (for a session to its peer), it returns
	// ErrWouldWait and the connection calls it again, with wait true,
	// aside, so the engine's other requests are not held up.
	Submit(o Owner, m *wire.Submit, wait bool) (Transfer, error)
	// SubmitHead starts a transfer sent in pieces (PROTOCOL.md 9.5b)
	// from its first piece, as Submit does (wait and ErrWouldWait alike);
	// its Grower takes the rest of the ops as they come.
	SubmitHead(o Owner, m *wire.SubmitHead, wait bool) (Transfer, Grower, error)
	SubmitKV(o Owner, m *wire.SubmitKV) (Transfer, error)
	Lookup(o Owner, id uint64) (Transfer, error)
	Cancel(o Owner, id uint64) error
	Query(o Owner, m *wire.Query) ([]byte, error)
	// OpenInbox makes o's connection the receiver of the tickets peers
	// address to a name; PostTicket sends one to a peer's inbox and waits
	// for its answer (it blocks: called aside); TakeTickets takes what
	// waits in o's group's inboxes, waiting up to m.WaitMs (or until
	// cancel closes) for the first (PROTOCOL.md 9.19).
	OpenInbox(o Owner, m *wire.OpenInbox) error
	PostTicket(o Owner, m *wire.PostTicket) error
	TakeTickets(o Owner, m *wire.TakeTickets, cancel <-chan struct{}) []wire.TicketItem
	// Closed: the connection o ended, and every request it made was
	// answered. What it registered goes (its regions and KV caches), and
	// transfers that hold them fail.
	Closed(o Owner)
}

// Transfer is an engine's transfer as its connection sees it.
type Transfer interface {
	ID() uint64
	// Status is the transfer's XferStatus answering request req.
	Status(req uint64) *wire.XferStatus
	// Done is closed when the transfer finished.
	Done() <-chan struct{}
	// WhenDone runs f once the transfer finished (at once if it has); f
	// must not block.
	WhenDone(f func())
}

// Grower takes the rest of a transfer sent in pieces. The connection
// calls it from one goroutine at a time, in the pieces' order.
type Grower interface {
	// Grow hands the transfer its next piece's ops (end: the last piece).
	// An error means the transfer failed (its status says why): it takes
	// nothing more.
	Grow(ops []wire.LocalOp, end bool) error
	// Abort fails the transfer with err: the rest of its pieces will not
	// come (their time passed, the connection closed, a piece was refused).
	Abort(err error)
}
