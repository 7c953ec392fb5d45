package proxy

import (
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// tickEvery is how often deadlines are checked.
const tickEvery = 100 * time.Millisecond

// loop feeds the Sender core and performs what it returns. It is the only
// goroutine that touches s.core.
func (s *Server) loop() {
	defer s.wg.Done()
	defer s.gather.startMappers()()
	t := time.NewTicker(tickEvery)
	defer t.Stop()
	for {
		select {
		case <-s.mbox.signal:
		case now := <-t.C:
			s.mbox.post(staging.Event{Kind: staging.EvTick, Now: now})
			for _, ss := range s.sessions.liveList() {
				ss.tick(now)
			}
			s.preauth.summarize(now, s.log)
		case <-s.ctx.Done():
			s.drainLoop()
			return
		}
		for _, ev := range s.mbox.take() {
			s.perform(s.core.Step(ev))
		}
		s.sendInUse.Store(int64(s.sendPool.Cap() - s.core.FreeSlots()))
	}
}

// idle reports whether the core holds no slot and no transfer (slots whose
// renewal failed are gone for good and not waited for).
func (s *Server) idle() bool {
	return s.core.FreeSlots() == s.core.Slots() && s.core.Active() == 0
}

// drainLoop runs at shutdown: sessions are closed, so the core fails what
// is left; copies in flight still report back and are absorbed here until
// every slot is home.
func (s *Server) drainLoop() {
	deadline := time.After(10 * time.Second)
	for !s.idle() {
		for _, ev := range s.mbox.take() {
			s.perform(s.core.Step(ev))
		}
		if s.idle() {
			break
		}
		select {
		case <-s.mbox.signal:
		case <-time.After(tickEvery):
			// Sessions already closed; make the core fail anything left.
			s.perform(s.core.Step(staging.Event{Kind: staging.EvTick, Now: time.Now().Add(24 * time.Hour)}))
		case <-deadline:
			s.log.Error("shutdown: send slots still busy after 10s")
			return
		}
	}
	s.sendInUse.Store(int64(s.sendPool.Cap() - s.core.FreeSlots()))
}

func (s *Server) perform(r *staging.Ready) {
	for _, c := range r.Copies {
		s.gather.start(c)
	}
	for _, c := range r.Sends {
		ox := s.outs.get(c.Transfer)
		var ds *dataStream
		if ox != nil {
			ox.ss.mu.Lock()
			if !ox.ss.closed && c.Stream < len(ox.ss.streams) {
				ds = ox.ss.streams[c.Stream]
			}
			ox.ss.mu.Unlock()
		}
		if ds == nil || !ds.enqueue(sendJob{cmd: c, wireID: ox.wireID, checksum: ox.checksum}) {
			s.mbox.post(staging.Event{Kind: staging.EvWritten, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream, Err: errStreamClosed, Now: time.Now()})
		}
	}
	for _, d := range r.Done {
		ox := s.outs.get(d.Transfer)
		if ox == nil {
			continue
		}
		if errors.Is(d.Err, staging.ErrTimeout) {
			if n := ox.ss.unstick(time.Now()); n > 0 {
				s.log.Warn("data streams stuck in a write shut down after a transfer missed its deadline",
					zap.String("peer", ox.ss.peerName), zap.Int("streams", n))
			}
		}
		err := coreErr(d.Err)
		if ox.local != nil {
			// Our push failed here (chunks damaged past the resend bound,
			// a copy failed, no progress): the receiver lets go of it at
			// once rather than at its own deadline.
			if err != nil && errCode(err) != wire.CodePeerUnavailable && errCode(err) != wire.CodeCancelled {
				ox.ss.send(&wire.Nack{Transfer: ox.wireID, Code: errCode(err), Message: err.Error()})
			}
			ox.local.addDone(d.Bytes)
			s.finishLocal(ox.local, err)
			continue
		}
		// A pull we served: tell subscribers, and the peer whenever it
		// failed here, whatever the cause. A pull that failed for want of
		// a data stream while its session lives (the stream broke, or none
		// was up yet) was once left unanswered, and the requester waited
		// for its chunks until its own deadline. On a closed session send
		// drops the Nack: the requester hears of that from the session
		// itself. A pull the requester ended with its own Nack needs none.
		if err != nil && !errors.As(d.Err, new(nackedByPeer)) {
			ox.ss.send(&wire.Nack{Transfer: ox.wireID, Code: errCode(err), Message: err.Error()})
		}
		n := &wire.Notify{Transfer: ox.wireID, Peer: ox.ss.peerName, Route: routeName(ox.ss), Tag: ox.tag, Dir: wire.Pull, Bytes: d.Bytes}
		ox.kvn.fill(n)
		if err != nil {
			n.Code, n.Message = errCode(err), err.Error()
			ox.ss.link.XfersFailed.Add(1)
		} else {
			ox.ss.link.XfersOK.Add(1)
		}
		s.notify(n)
	}
	if len(r.Progress) > 0 {
		s.outs.progress(r.Progress)
	}
	for _, k := range r.Retired {
		s.retire(k)
	}
	if len(r.Taint) > 0 {
		s.renewSlots(append([]staging.SendSlot(nil), r.Taint...))
	}
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
