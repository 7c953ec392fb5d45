package proxy

import (
	"errors"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/rawconn"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// tickEvery is how often deadlines are checked.
const tickEvery = 100 * time.Millisecond

// sender is the send side's engine: the pure sender core
// (staging.Sender), the mailbox that feeds it events, the send slots and
// the copies that gather chunks into them (gatherer), and whether chunks
// leave by splice (send_splice.go). One goroutine (run) steps the core and
// performs its output; everyone else only posts. What the output touches
// beyond that (the transfer tables, the engines' answers) is the server's.
type sender struct {
	s      *Server
	mbox   *mailbox
	core   *staging.Sender
	gather gatherer      // the core's copies into send slots (send_gather.go)
	pool   *staging.Pool // the send slots
	inUse  atomic.Int64  // send slots the core holds, for stats and Leaks
	// splice: data-stream writers send payloads with vmsplice+splice
	// (staging.splice_send, plaintext only); spliceRefused: vmsplice
	// refused a slot once and that was logged.
	splice        bool
	spliceRefused atomic.Bool
	// spliceProbe replaces the start-up probe in tests (nil: the real one).
	spliceProbe func(size int) (rawconn.SpliceProbe, error)
	// sockStreams: socketBytes' buffer (the run goroutine's only).
	sockStreams []*dataStream
}

// post queues an event for the core; it never blocks.
func (sd *sender) post(ev staging.Event) { sd.mbox.post(ev) }

// run feeds the sender core and performs what it returns. It is the only
// goroutine that touches sd.core.
func (sd *sender) run() {
	defer sd.s.wg.Done()
	defer sd.gather.startMappers()()
	t := time.NewTicker(tickEvery)
	defer t.Stop()
	for {
		select {
		case <-sd.mbox.signal:
		case now := <-t.C:
			sd.mbox.post(staging.Event{Kind: staging.EvTick, Now: now})
			for _, ss := range sd.s.sessions.liveList() {
				ss.tick(now)
			}
			sd.s.preauth.summarize(now, sd.s.log)
		case <-sd.s.ctx.Done():
			sd.drainLoop()
			return
		}
		for _, ev := range sd.mbox.take() {
			sd.perform(sd.core.Step(ev))
		}
		sd.inUse.Store(int64(sd.pool.Cap() - sd.core.FreeSlots()))
	}
}

// idle reports whether the core holds no slot and no transfer (slots whose
// renewal failed are gone for good and not waited for).
func (sd *sender) idle() bool {
	return sd.core.FreeSlots() == sd.core.Slots() && sd.core.Active() == 0
}

// drainLoop runs at shutdown: sessions are closed, so the core fails what
// is left; copies in flight still report back and are absorbed here until
// every slot is home.
func (sd *sender) drainLoop() {
	deadline := time.After(10 * time.Second)
	for !sd.idle() {
		for _, ev := range sd.mbox.take() {
			sd.perform(sd.core.Step(ev))
		}
		if sd.idle() {
			break
		}
		select {
		case <-sd.mbox.signal:
		case <-time.After(tickEvery):
			// Sessions already closed; make the core fail anything left.
			sd.perform(sd.core.Step(staging.Event{Kind: staging.EvTick, Now: time.Now().Add(24 * time.Hour)}))
		case <-deadline:
			sd.s.log.Error("shutdown: send slots still busy after 10s")
			return
		}
	}
	sd.inUse.Store(int64(sd.pool.Cap() - sd.core.FreeSlots()))
}

func (sd *sender) perform(r *staging.Ready) {
	for _, c := range r.Copies {
		sd.gather.start(c)
	}
	for _, c := range r.Sends {
		ox := sd.s.outs.get(c.Transfer)
		var ds *dataStream
		if ox != nil {
			ds = ox.ss.streams.get(c.Stream)
		}
		if ds == nil || !ds.enqueue(sendJob{cmd: c, wireID: ox.wireID, checksum: ox.checksum}) {
			sd.mbox.post(staging.Event{Kind: staging.EvWritten, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream, Err: errStreamClosed, Now: time.Now()})
		}
	}
	for _, d := range r.Done {
		ox := sd.s.outs.get(d.Transfer)
		if ox == nil {
			continue
		}
		if errors.Is(d.Err, staging.ErrTimeout) {
			if n := ox.ss.streams.unstick(time.Now()); n > 0 {
				sd.s.log.Warn("data streams stuck in a write shut down after a transfer missed its deadline",
					zap.String("peer", ox.ss.peerName), zap.Int("streams", n))
			}
		}
		if d.Err == nil {
			sd.logShape(ox, d)
		}
		ox.end.done(ox, d.Bytes, d.Err)
	}
	if len(r.Progress) > 0 {
		sd.s.outs.progress(r.Progress)
	}
	for _, k := range r.Retired {
		sd.s.retire(k)
	}
	if len(r.Taint) > 0 {
		sd.renewSlots(append([]staging.SendSlot(nil), r.Taint...))
	}
}

// logShape writes, at debug level, where a push's time went over TCP
// (staging.Shape): the first gather and the first write after the submit,
// the tail while streams ran out unevenly, the drain after the last write
// (docs/BENCHMARKS.md profiles one-transfer rows with these).
func (sd *sender) logShape(ox *outXfer, d staging.Completion) {
	ce := sd.s.log.Check(zap.DebugLevel, "tcp push")
	if ce == nil {
		return
	}
	h := d.Shape
	ce.Write(zap.Uint64("transfer", ox.wireID), zap.String("peer", ox.ss.peerName), zap.Uint64("bytes", d.Bytes),
		zap.Int("streams", h.Streams), zap.Duration("gathered", h.Gather()),
		zap.Duration("ramp", h.Ramp()), zap.Duration("tail", h.Tail()), zap.Duration("drain", h.Drain()), zap.Duration("total", h.Total()))
}

// coreErr gives the core's errors their wire codes.
func coreErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, staging.ErrTimeout):
		return codeErr(wire.CodeTimeout, "%w", err)
	case errors.Is(err, staging.ErrCancelled):
		return codeErr(wire.CodeCancelled, "%w", err)
	case errors.Is(err, staging.ErrNoStreams), errors.Is(err, staging.ErrNoSession):
		return codeErr(wire.CodePeerUnavailable, "%w", err)
	case errors.Is(err, staging.ErrDamaged):
		return codeErr(wire.CodeChecksum, "%w", err)
	}
	if _, ok := err.(*status.Error); ok {
		return err
	}
	return codeErr(errCode(err), "%w", err)
}

// outEnd is whom an outgoing transfer's progress and end concern: the
// engine of our push, or the peer (and subscribers) of a pull we serve.
type outEnd interface {
	progress(bytes uint64) // bytes acked so far
	// done: the core ended the transfer with bytes acked, err its
	// error (nil: every chunk acked).
	done(ox *outXfer, bytes uint64, err error)
	// retired: the core let go of it; its wire id leaves the answer table.
	retired(ox *outXfer)
}

// ourPush is the engine's transfer of our push: its XferStatus.Done
// counts acked bytes, and its end answers the engine.
type ourPush struct{ lx *localXfer }

func (p ourPush) progress(bytes uint64) { p.lx.addDone(bytes) }

func (p ourPush) done(ox *outXfer, bytes uint64, cerr error) {
	// Our push failed here (chunks damaged past the resend bound, a copy
	// failed, no progress): the receiver lets go of it at once rather
	// than at its own deadline.
	err := coreErr(cerr)
	if err != nil && errCode(err) != wire.CodePeerUnavailable && errCode(err) != wire.CodeCancelled {
		ox.ss.send(&wire.Nack{Transfer: ox.wireID, Code: errCode(err), Message: err.Error()})
	}
	p.lx.addDone(bytes)
	ox.ss.s.finishLocal(p.lx, err)
}

func (ourPush) retired(ox *outXfer) { ox.ss.out.forget(ox.wireID, corePush(ox.key)) }

// servedPull is a pull we serve; kvn says what a KV pull's Notify
// reports was sent (nil for bytes).
type servedPull struct{ kvn *kvNote }

func (servedPull) progress(uint64) {}

// done tells subscribers, and the peer whenever the pull failed here,
// whatever the cause. A pull that failed for want of a data stream while
// its session lives (the stream broke, or none was up yet) was once left
// unanswered, and the requester waited for its chunks until its own
// deadline. On a closed session send drops the Nack: the requester hears
// of that from the session itself. A pull the requester ended with its
// own Nack needs none.
func (p servedPull) done(ox *outXfer, bytes uint64, cerr error) {
	err := coreErr(cerr)
	if err != nil && !errors.As(cerr, new(nackedByPeer)) {
		ox.ss.send(&wire.Nack{Transfer: ox.wireID, Code: errCode(err), Message: err.Error()})
	}
	n := &wire.Notify{Transfer: ox.wireID, Peer: ox.ss.peerName, Route: routeName(ox.ss), Tag: ox.tag, Dir: wire.Pull, Bytes: bytes}
	p.kvn.fill(n)
	if err != nil {
		n.Code, n.Message = errCode(err), err.Error()
		ox.ss.link.XfersFailed.Add(1)
	} else {
		ox.ss.link.XfersOK.Add(1)
	}
	ox.ss.s.notify(n, ox.regions)
}

// retired keeps the pull's core key past its end (answerTable.retire),
// so that a late Ack still reaches the core, which returns the credits it
// owes.
func (servedPull) retired(ox *outXfer) { ox.ss.out.retire(ox.wireID, ox.key) }
