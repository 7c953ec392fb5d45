package staging

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
)

// The receive core: the rules for chunks that land here (PROTOCOL 8.5,
// 8.5a, 8.7), beside the Sender's for chunks that leave. One Receiver
// holds the incoming transfers of one peer session. Like the Sender it
// does no I/O and reads no clock: the proxy feeds it events (a transfer
// admitted, a chunk's header read, its payload landed or found damaged,
// the stream lost under it, a tick) and performs what it returns (Ack,
// Credit, Resend, Nack frames, completions, regions to let go of). It is
// not safe for concurrent use: its owner (the proxy's session lock) steps
// it, and performs the output after letting go of the lock, since the
// output is the caller's own (Step appends to it and keeps no reference).
//
// The rules, in one place:
//   - credits: a chunk that takes a credit (of a pipeline transfer) gets
//     exactly one answer that returns it: Ack when it landed, Resend when
//     it arrived damaged, Credit when it will not land. Inline and ring
//     chunks take none and return none.
//   - duplicates: a landed bitmap per transfer; a second copy of a landed
//     chunk lands again (same bytes) but is answered with nothing and
//     counts once toward completion.
//   - tombstones: a finished or refused push is remembered (maxGone per
//     session), with whether every chunk landed, and, for a failed one,
//     which chunks had (within maxGoneBitWords), so a late second copy is
//     still answered with nothing and other late chunks with Credit.
//   - holds: a chunk being read or landed holds its transfer; a finished
//     transfer's regions are let go (Released) once no chunk holds it.

// RecvEventKind says what happened to an incoming transfer.
type RecvEventKind uint8

// Events the proxy feeds to a Receiver.
const (
	RxOpen    RecvEventKind = iota + 1 // Transfer, Total, Timeout, Pull, Inline: admitted (out.Err: refused)
	RxRefused                          // Transfer, Err: a push refused before it was opened
	RxChunk                            // Transfer, Chunk, Count, Inline, Err: a chunk's header arrived (Err: its segments do not fit)
	RxCheck                            // Transfer, Chunk, Count, Err: RxChunk for a ring chunk, whose answers are not ours to give
	RxLanded                           // Transfer, Chunk, Bytes, Err: a held chunk's payload is on the device (Err: it is not)
	RxDamaged                          // Transfer, Chunk, Err: a held chunk's CRC32C did not match; Err says so for an inline one
	RxRelease                          // Transfer: a chunk lets go of its hold (landed, damaged, or its stream was lost mid-read)
	RxViaRing                          // Transfer: its chunks come through a shared ring (no Ack, no Credit)
	RxTouch                            // Transfer: progress without a chunk (a direct copy is under way)
	RxDirect                           // Transfer, Bytes: all its bytes were copied directly (out.Err: refused)
	RxFail                             // Transfer, Err, TellPeer: end it
	RxTick                             // Now: fail transfers without progress for their timeout
	RxClose                            // Err: the session closed: fail all, open no more
)

// RecvEvent is one input to Receiver.Step. Transfer is the wire id the
// peer's frames carry (the receiver is per session, so it is unique).
type RecvEvent struct {
	Kind     RecvEventKind
	Transfer uint64
	Chunk    uint32
	Count    uint32 // RxChunk: chunks in the transfer, as the chunk says
	Bytes    uint64 // RxLanded: the chunk's payload; RxDirect: the transfer's
	Total    uint64 // RxOpen
	Timeout  time.Duration
	Pull     bool // RxOpen: our pull (no admission limits, no tombstone when it fails)
	Inline   bool // RxOpen: an inline push; RxChunk: the chunk is flagged inline
	TellPeer bool // RxFail: send a Nack
	Err      error
	Now      time.Time
}

// Answer names one chunk of a transfer, for an Ack or a Resend.
type Answer struct {
	Transfer uint64
	Chunk    uint32
}

// RecvFailure is a Nack to send: Transfer failed here with Err.
type RecvFailure struct {
	Transfer uint64
	Err      error
}

// RecvDone reports a transfer finished: Err nil when every chunk landed.
type RecvDone struct {
	Transfer uint64
	Bytes    uint64 // landed bytes
	Err      error
}

// RecvProgress: our pull Transfer has Bytes landed so far.
type RecvProgress struct {
	Transfer uint64
	Bytes    uint64
}

// RecvReady is what the proxy must do after a Step, in this order: Acks,
// Credits, Resends, Nacks, Progress, then Done (after its Nack, so a peer
// hears of a failure before the engine or a subscriber does), Released.
type RecvReady struct {
	// Hold: RxChunk and RxCheck took a hold on the transfer: read the
	// payload and land it, then step RxLanded or RxDamaged and RxRelease
	// (or only RxRelease when the stream was lost meanwhile).
	Hold bool
	// Err: RxOpen and RxDirect were refused; RxChunk and RxCheck refused
	// the chunk for breaking a rule (nil when it is only late: its
	// transfer unknown or finished).
	Err      error
	Acks     []Answer
	Credits  int // Credit frames of Grant 1 owed, one per chunk drained
	Resends  []Answer
	Nacks    []RecvFailure
	Done     []RecvDone
	Progress []RecvProgress
	// Released lists finished transfers no chunk holds: let go of their
	// regions. Each is released once and then forgotten by the core.
	Released []uint64
	// Duplicates counts second copies of chunks that had landed.
	Duplicates int
}

// Reset empties r for reuse, keeping its slices' arrays.
func (r *RecvReady) Reset() {
	*r = RecvReady{Acks: r.Acks[:0], Resends: r.Resends[:0], Nacks: r.Nacks[:0], Done: r.Done[:0],
		Progress: r.Progress[:0], Released: r.Released[:0]}
}

// Errors a Receiver reports. Their Error() is the message the peer or the
// engine reads (the proxy gives them wire codes by kind: errors.Is).
var (
	ErrMalformed = errors.New("malformed chunk or transfer")
	ErrExists    = errors.New("transfer id in use")
	ErrBusy      = errors.New("too many transfers from the peer")
	ErrClosed    = errors.New("session closed")
	ErrFinished  = errors.New("transfer already finished")
)

// ruleError is a broken rule: its kind for errors.Is, its own message.
type ruleError struct {
	kind error
	msg  string
}

func (e *ruleError) Error() string { return e.msg }
func (e *ruleError) Unwrap() error { return e.kind }

func ruleErr(kind error, format string, args ...any) error {
	return &ruleError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// MaxRecvChunks bounds the landed bitmap a peer can make us allocate.
const MaxRecvChunks = 1 << 24

// path says how a transfer's chunks come, which decides how they are
// answered: the pipeline's take and return credits; inline and ring
// chunks take none, and ring chunks are answered on the node connection.
type path uint8

const (
	pathPipeline path = iota
	pathInline
	pathRing
)

type rxfer struct {
	id       uint64
	total    uint64
	pull     bool
	path     path
	timeout  time.Duration
	progress time.Time
	count    uint32
	bits     []uint64
	bit0     [1]uint64 // bits of a transfer of at most 64 chunks
	nLanded  uint32
	bytes    uint64
	holds    int
	finished bool
}

// has reports whether chunk idx landed.
func (x *rxfer) has(idx uint32) bool {
	return idx < x.count && x.bits[idx/64]&(uint64(1)<<(idx%64)) != 0
}

// quiet: its chunks return no credit.
func (x *rxfer) quiet() bool { return x.path != pathPipeline }

// Receiver holds one session's incoming transfers.
type Receiver struct {
	maxLive int
	xfers   map[uint64]*rxfer // open, or finished and still held
	live    int               // open (not finished) transfers
	closed  bool
	gone    tombstones
	spare   []*rxfer // retired records for the next opens (at most maxSpare)
	out     *RecvReady
	now     time.Time
}

// maxSpare is how many retired transfer records a Receiver keeps for
// reuse: a session's small pushes, one after another, then open theirs
// without allocating.
const maxSpare = 8

// NewReceiver makes the core of one session; it admits at most maxLive
// open transfers (limits.max_transfers_per_peer) besides our pulls.
func NewReceiver(maxLive int) *Receiver {
	return &Receiver{maxLive: maxLive, xfers: map[uint64]*rxfer{}, gone: newTombstones(maxGone, maxGoneBitWords)}
}

// RecvState is what the core knows of a transfer id.
type RecvState uint8

// States of a transfer id.
const (
	RecvUnknown RecvState = iota // never opened, or forgotten
	RecvOpen                     // opened and not finished
	RecvGone                     // finished or refused: its chunks are late
)

// State says whether transfer id is open, gone, or unknown (a chunk of
// an unknown one may have overtaken its Announce: the proxy waits).
func (r *Receiver) State(id uint64) RecvState {
	if x := r.xfers[id]; x != nil && !x.finished {
		return RecvOpen
	}
	if r.gone.has(id) {
		return RecvGone
	}
	return RecvUnknown
}

// Closed reports whether RxClose was stepped.
func (r *Receiver) Closed() bool { return r.closed }

// Live is the number of open transfers.
func (r *Receiver) Live() int { return r.live }

// Step applies one event and appends what to do to out.
func (r *Receiver) Step(ev RecvEvent, out *RecvReady) {
	if !ev.Now.IsZero() {
		r.now = ev.Now
	}
	r.out = out
	defer func() { r.out = nil }()
	x := r.xfers[ev.Transfer]
	switch ev.Kind {
	case RxOpen:
		out.Err = r.open(ev)
	case RxRefused:
		// A duplicate id's refusal leaves the first transfer with it be.
		if !errors.Is(ev.Err, ErrExists) {
			r.gone.bury(ev.Transfer, false)
		}
	case RxChunk:
		r.chunk(x, ev)
	case RxCheck:
		out.Err = r.check(x, ev)
		out.Hold = out.Err == nil
	case RxLanded:
		if x != nil {
			r.landed(x, ev)
		}
	case RxDamaged:
		if x != nil {
			r.damaged(x, ev)
		}
	case RxRelease:
		if x != nil {
			x.holds--
			r.maybeRetire(x)
		}
	case RxViaRing:
		if x != nil {
			x.path = pathRing
		}
	case RxTouch:
		if x != nil {
			x.progress = r.now
		}
	case RxDirect:
		out.Err = r.direct(x, ev.Bytes)
	case RxFail:
		if x != nil {
			r.fail(x, ev.Err, ev.TellPeer)
		}
	case RxTick:
		r.tick()
	case RxClose:
		r.closed = true
		for _, x := range r.openXfers() {
			r.fail(x, ev.Err, false)
		}
	}
}

// openXfers lists the open transfers by id, so that what a Step fails
// comes out in one order whatever the map's.
func (r *Receiver) openXfers() []*rxfer {
	var xs []*rxfer
	for _, x := range r.xfers {
		if !x.finished {
			xs = append(xs, x)
		}
	}
	sortXfers(xs)
	return xs
}

func sortXfers(xs []*rxfer) {
	slices.SortFunc(xs, func(a, b *rxfer) int { return cmp.Compare(a.id, b.id) })
}
