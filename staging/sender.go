package staging

import (
	"errors"
	"fmt"
	"time"
)

// EventKind says what happened.
type EventKind uint8

// Events the proxy feeds to a Sender.
const (
	EvSessionUp   EventKind = iota + 1 // Session, N = data streams, Credits = initial credits
	EvSessionDown                      // Session, Err
	EvStreamUp                         // Session, Stream: a data stream attached
	EvSubmit                           // Session, Transfer, Plan, Timeout
	EvCopyDone                         // Transfer, Chunk, Slot, Err
	EvWritten                          // Transfer, Chunk, Slot, Stream, Err
	EvAck                              // Session, Transfer, Chunks (each returns a credit)
	EvCredit                           // Session, Credits
	EvNack                             // Session, Transfer, Err: the peer refused it (only the transfer's own session may)
	EvStreamLost                       // Session, Stream, Err
	EvCancel                           // Transfer
	EvTick                             // Now
	EvResend                           // Session, Transfer, Chunk: the chunk arrived damaged; returns its credit
	EvRenewed                          // Slot, Err: a tainted slot has fresh pages (Err: it could not get them)
	EvGrow                             // Transfer, Ops: more ops of a growing plan; Err: the rest will not come (fails it)
)

// SendSlot is a slot of the send half of the pinned pool (slot i of the
// proxy's send pool), which the core owns: it hands one to a chunk's copy
// and send, and takes it back when the bytes are gone. A type of its own
// so that it is not taken for a receive slot, a stream or a chunk index,
// all plain ints.
type SendSlot int

// MaxResends is how many chunks of one transfer may be sent again because
// the receiver found them damaged (EvResend) before the transfer fails.
const MaxResends = 8

// Key names a transfer inside the core: chosen by the caller, unique
// among the transfers the core holds. It is neither a wire id (a peer's
// frames carry those; proxy maps them to keys) nor a session id, and its
// own type keeps the three apart where they meet.
type Key uint64

// Event is one input to Sender.Step. Now is the time of the event; the core
// reads no clock of its own.
type Event struct {
	Kind     EventKind
	Session  uint64
	Transfer Key
	Chunk    uint32
	Chunks   []uint32
	Slot     SendSlot
	Stream   int
	Spliced  bool // EvWritten: the kernel took the slot's pages, not a copy (splice.go)
	N        int
	Credits  int
	Plan     *Plan
	Ops      []PlanOp // EvGrow
	Timeout  time.Duration
	Err      error
	Now      time.Time
}

// CopyCmd: gather chunk Chunk of Transfer into slot Slot.
type CopyCmd struct {
	Transfer Key
	Chunk    uint32
	Slot     SendSlot
	C        *Chunk
}

// SendCmd: write slot Slot, holding chunk Chunk of Count, on stream Stream
// of Session; report EvWritten when the kernel has the bytes.
type SendCmd struct {
	Session  uint64
	Stream   int
	Transfer Key
	Chunk    uint32
	Count    uint32
	Slot     SendSlot
	C        *Chunk
}

// Completion: Transfer finished; Err is nil when every chunk was acked.
type Completion struct {
	Transfer Key
	Session  uint64
	Bytes    uint64 // acked bytes
	Err      error
	Shape    Shape // when its chunks moved (shape.go)
}

// Progress: Transfer has Bytes acked so far (it grew in this Step).
type Progress struct {
	Transfer Key
	Bytes    uint64
}

// Ready is what the proxy must do after a Step. Its slices are reused by the
// next Step.
type Ready struct {
	Copies []CopyCmd
	Sends  []SendCmd
	Done   []Completion
	// Progress lists running transfers whose acked bytes grew, for
	// XferStatus.Done; a completion carries the final count instead.
	Progress []Progress
	// Retired transfers are finished and hold no slot: no copy reads their
	// memory any more, so their regions may be let go. A transfer retires
	// in the same Step as its completion or in a later one.
	Retired []Key
	// Taint lists slots given up while the kernel may still reference
	// their pages (splice.go): renew each and report EvRenewed.
	Taint []SendSlot
}

// Errors a Sender reports in completions; the proxy maps them to codes.
var (
	ErrTimeout     = errors.New("no progress before the deadline")
	ErrCancelled   = errors.New("cancelled")
	ErrNoStreams   = errors.New("every data stream to the peer was lost")
	ErrNoSession   = errors.New("no session to the peer")
	ErrDuplicateID = errors.New("duplicate transfer id")
	ErrDamaged     = errors.New("chunks keep arriving damaged")
)

// chunk states
const (
	chPending uint8 = iota
	chCopying
	chSending
	chSent
	chAcked
)

type sstream struct {
	alive    bool
	inflight int    // chunks handed to its writer, not yet written
	unsent   uint64 // their payload bytes
	sock     uint64 // bytes its socket held unacknowledged when last read (balance.go)
}

type ssess struct {
	id      uint64
	credits int
	streams []sstream
	active  []*sxfer // round robin
	rr      int
	ahead   int        // chunks copying, waiting for a stream or queued on one, not yet written
	held    int        // send slots its transfers hold (fair.go)
	waiting []gathered // gathered chunks no stream has room for yet (dispatch.go), oldest first
	probed  uint64     // the Step whose socket reading sock holds (balance.go)
	sockBuf []uint64   // the probe's buffer
}

type sxfer struct {
	id       Key
	sess     *ssess
	plan     *Plan
	state    []uint8
	onStream []uint16 // onStream[c]: 1 + the stream c's last copy went on; 0: never sent
	next     int      // next never-started chunk
	redo     []uint32 // chunks to send again
	held     []int32  // held[c]: slot of spliced chunk c kept until answered; -1: none (nil until one is)
	ghost    []bool   // ghost[c]: an earlier copy of c was given up unanswered (nil until one is)
	resends  int      // chunks sent again at the receiver's request
	acked    int
	bytes    uint64
	busy     int // chunks holding a slot (copying or sending)
	timeout  time.Duration
	progress time.Time
	finished bool // completion emitted
	shape    shapeClock
}

// Sender schedules outgoing chunks over all peer sessions. It is not safe
// for concurrent use: one goroutine feeds it.
type Sender struct {
	free     []SendSlot
	slots    int
	renewing int // tainted slots handed out for renewal
	broken   int // slots whose renewal failed: never used again
	depth    int // chunks ahead of the socket per live stream; 0: no limit
	queue    int // chunks handed to one stream and not yet written; 0: no limit (dispatch.go)
	sessions map[uint64]*ssess
	order    []*ssess
	rr       int
	xfers    map[Key]*sxfer
	tombs    tombs
	ready    Ready
	now      time.Time
	steps    uint64 // Steps taken
	// probe reads a session's sockets for balancing on their bytes
	// (balance.go); nil: balance on unwritten chunks. tail: the smallest
	// chunk a transfer's end is cut into (tail.go); 0: not cut.
	probe SocketProbe
	tail  uint32
}

// NewSender makes a core that owns slots 0..slots-1 of the send pool.
func NewSender(slots int) *Sender { return NewSenderDepth(slots, 0) }

// NewSenderDepth is NewSender that keeps at most depth chunks per live
// data stream gathered (or being gathered) and not yet written: a chunk is
// copied to its slot shortly before a socket takes it, while the bytes the
// copy engine wrote may still sit in the CPU's cache, instead of waiting
// behind a long queue. 0 means no limit but slots and credits.
func NewSenderDepth(slots, depth int) *Sender {
	s := &Sender{slots: slots, depth: depth, sessions: map[uint64]*ssess{}, xfers: map[Key]*sxfer{}}
	for i := slots - 1; i >= 0; i-- {
		s.free = append(s.free, SendSlot(i))
	}
	return s
}

// FreeSlots is the number of send slots not handed out.
func (s *Sender) FreeSlots() int { return len(s.free) }

// Credits is the number of chunks session may still send before the peer
// answers more; -1 for an unknown session.
func (s *Sender) Credits(session uint64) int {
	if ss := s.sessions[session]; ss != nil {
		return ss.credits
	}
	return -1
}

// Active is the number of transfers not yet finished or still holding slots.
func (s *Sender) Active() int { return len(s.xfers) }

// Step applies one event and returns what to do.
func (s *Sender) Step(ev Event) *Ready {
	s.ready.Copies = s.ready.Copies[:0]
	s.ready.Sends = s.ready.Sends[:0]
	s.ready.Done = s.ready.Done[:0]
	s.ready.Progress = s.ready.Progress[:0]
	s.ready.Retired = s.ready.Retired[:0]
	s.ready.Taint = s.ready.Taint[:0]
	s.steps++
	if !ev.Now.IsZero() {
		s.now = ev.Now
	}
	switch ev.Kind {
	case EvSessionUp:
		s.sessionUp(ev)
	case EvSessionDown:
		if ss := s.sessions[ev.Session]; ss != nil {
			s.dropSession(ss, ev.Err)
		}
	case EvStreamUp:
		if ss := s.sessions[ev.Session]; ss != nil && ev.Stream >= 0 {
			for len(ss.streams) <= ev.Stream {
				ss.streams = append(ss.streams, sstream{})
			}
			ss.streams[ev.Stream].alive = true
		}
	case EvSubmit:
		s.submit(ev)
	case EvCopyDone:
		s.copyDone(ev)
	case EvWritten:
		s.written(ev)
	case EvAck:
		s.ack(ev)
	case EvCredit:
		if ss := s.sessions[ev.Session]; ss != nil {
			ss.credits += ev.Credits
		}
	case EvNack:
		// A Nack fails a transfer only when it came on the transfer's own
		// session: another peer naming our id must change nothing.
		if x := s.xfers[ev.Transfer]; x != nil && x.sess != nil && x.sess == s.sessions[ev.Session] {
			s.fail(x, ev.Err)
		}
	case EvStreamLost:
		if ss := s.sessions[ev.Session]; ss != nil {
			s.streamLost(ss, ev.Stream, ev.Err)
		}
	case EvCancel:
		if x := s.xfers[ev.Transfer]; x != nil {
			s.fail(x, ErrCancelled)
		}
	case EvTick:
		s.tick()
	case EvResend:
		s.resend(ev)
	case EvRenewed:
		s.renewed(ev)
	case EvGrow:
		s.grow(ev)
	}
	s.dispatchAll()
	s.schedule()
	return &s.ready
}

func (s *Sender) sessionUp(ev Event) {
	if old := s.sessions[ev.Session]; old != nil {
		s.dropSession(old, fmt.Errorf("session %d replaced", ev.Session))
	}
	ss := &ssess{id: ev.Session, credits: ev.Credits, streams: make([]sstream, ev.N)}
	for i := range ss.streams {
		ss.streams[i].alive = true
	}
	s.sessions[ev.Session] = ss
	s.order = append(s.order, ss)
}

func (s *Sender) dropSession(ss *ssess, err error) {
	if err == nil {
		err = ErrNoSession
	}
	for len(ss.active) > 0 {
		s.fail(ss.active[0], err)
	}
	delete(s.sessions, ss.id)
	for i, o := range s.order {
		if o == ss {
			s.order = append(s.order[:i], s.order[i+1:]...)
			break
		}
	}
}

func (s *Sender) submit(ev Event) {
	if _, dup := s.xfers[ev.Transfer]; dup {
		s.ready.Done = append(s.ready.Done, Completion{Transfer: ev.Transfer, Session: ev.Session, Err: ErrDuplicateID})
		return
	}
	ss := s.sessions[ev.Session]
	if ss == nil {
		s.ready.Done = append(s.ready.Done, Completion{Transfer: ev.Transfer, Session: ev.Session, Err: ErrNoSession})
		s.ready.Retired = append(s.ready.Retired, ev.Transfer)
		return
	}
	if s.tail > 0 {
		ev.Plan.SplitTail(ss.aliveStreams(), s.tail)
	}
	n := ev.Plan.Len()
	x := &sxfer{id: ev.Transfer, sess: ss, plan: ev.Plan, state: make([]uint8, n), onStream: make([]uint16, n), timeout: ev.Timeout, progress: s.now}
	x.shape.Submitted = s.now
	s.xfers[x.id] = x
	ss.active = append(ss.active, x)
}

// grow gives a growing plan more ops (or, with Err, fails its transfer):
// the chunks they cover may start.
func (s *Sender) grow(ev Event) {
	x := s.xfers[ev.Transfer]
	if x == nil || x.finished {
		return // ended meanwhile (cancelled, failed): nothing to grow
	}
	err := ev.Err
	if err == nil {
		err = x.plan.Grow(ev.Ops)
	}
	if err != nil {
		s.fail(x, err)
		return
	}
	x.progress = s.now
}

func (s *Sender) copyDone(ev Event) {
	x := s.xfers[ev.Transfer]
	if x == nil {
		s.free = append(s.free, ev.Slot) // cannot happen: a transfer lives while it holds slots
		return
	}
	if x.finished || ev.Err != nil {
		// The chunk will not be sent: give back the credit it took. An
		// answer about c from now on can only be an earlier copy's, whose
		// credit came back when it was given up.
		x.sess.ahead--
		s.refund(x.sess)
		if x.state[ev.Chunk] == chCopying {
			x.state[ev.Chunk] = chPending
		}
		s.release(x, ev.Slot)
		if ev.Err != nil && !x.finished {
			x.redoChunk(ev.Chunk)
			s.fail(x, fmt.Errorf("copy of chunk %d to host: %w", ev.Chunk, ev.Err))
		}
		return
	}
	x.shape.gathered(s.now)
	s.enqueueGathered(x, ev.Chunk, ev.Slot)
}

func (s *Sender) written(ev Event) {
	x := s.xfers[ev.Transfer]
	if x == nil {
		s.giveBack(ev.Slot, ev.Spliced) // cannot happen: a transfer lives while it holds slots
		return
	}
	ss := x.sess
	ss.ahead--
	if ev.Stream >= 0 && ev.Stream < len(ss.streams) {
		st := &ss.streams[ev.Stream]
		st.inflight--
		st.unsent -= min(st.unsent, uint64(x.plan.ChunkLen(int(ev.Chunk))))
	}
	if ev.Spliced && ev.Err == nil && !x.finished && x.state[ev.Chunk] == chSending {
		x.hold(ev.Chunk, ev.Slot)
	} else {
		s.letGo(x, ev.Slot, ev.Spliced && (ev.Err != nil || !x.answeredCopy(ev.Chunk)))
	}
	if ev.Err != nil {
		// The chunk may or may not have reached the peer: give back its
		// credit, send it again (chunks are idempotent writes) and stop
		// using the stream.
		s.refund(ss)
		if x.finished {
			if x.state[ev.Chunk] == chSending {
				x.state[ev.Chunk] = chPending // its answer, if any, returns nothing more
			}
			return
		}
		if x.state[ev.Chunk] == chSending {
			x.redoChunk(ev.Chunk)
			x.markGhost(ev.Chunk)
		}
		s.streamLost(ss, ev.Stream, ev.Err)
		return
	}
	if x.finished {
		return
	}
	// Also when the chunk's ack came first (the peer can answer before
	// this report is handled).
	x.shape.written(ev.Stream, s.now)
	if x.state[ev.Chunk] == chSending {
		x.state[ev.Chunk] = chSent
		if ev.Stream >= 0 && ev.Stream < len(ss.streams) && !ss.streams[ev.Stream].alive {
			// Written into a stream whose loss was handled before this
			// report (streamLost saw the chunk still being written): it
			// may never arrive, so it goes again like the others.
			s.resendLost(x, ev.Chunk)
		}
	}
}

func (s *Sender) tick() {
	for _, x := range s.xfers {
		if !x.finished && x.timeout > 0 && s.now.Sub(x.progress) > x.timeout {
			s.fail(x, fmt.Errorf("%w (%v without an ack; %d of %d chunks acked)", ErrTimeout, x.timeout, x.acked, x.plan.Len()))
		}
	}
}

func (s *Sender) release(x *sxfer, slot SendSlot) { s.letGo(x, slot, false) }

// letGo returns a slot x held: to the free list, or, when tainted (the
// kernel may still reference its pages), out for renewal.
func (s *Sender) letGo(x *sxfer, slot SendSlot, tainted bool) {
	s.giveBack(slot, tainted)
	x.sess.held--
	x.busy--
	if x.finished && x.busy == 0 {
		s.retire(x)
	}
}

func (s *Sender) fail(x *sxfer, err error) { s.finish(x, err) }

func (s *Sender) finish(x *sxfer, err error) {
	if x.finished {
		return
	}
	s.taintHeld(x)   // before finished is set: letGo must not retire x here
	s.dropWaiting(x) // likewise
	x.finished = true
	s.ready.Done = append(s.ready.Done, Completion{Transfer: x.id, Session: x.sess.id, Bytes: x.bytes, Err: err, Shape: x.shape.done(s.now)})
	act := x.sess.active
	for i, a := range act {
		if a == x {
			x.sess.active = append(act[:i], act[i+1:]...)
			if x.sess.rr > i {
				x.sess.rr--
			}
			break
		}
	}
	if x.busy == 0 {
		s.retire(x)
	}
}

func (s *Sender) retire(x *sxfer) {
	delete(s.xfers, x.id)
	s.bury(x)
	s.ready.Retired = append(s.ready.Retired, x.id)
}
