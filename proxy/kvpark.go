// What comes before the engine is ready for it. First, a peer's KV push
// (or pull) that came before its grant (PROTOCOL.md 9.20). An
// engine receiving pushes hands the pusher a transfer key and grants it on
// its cache, and the two may travel apart: vLLM's scheduler posts the push
// ticket while its worker grants at the next step, so the push may reach
// this sidecar first. Refusing it then would have the engine recompute
// what was on its way. A KVAnnounce that names a key no live grant holds
// yet waits here instead, up to kvGrantWait, and is admitted as soon as
// a grant comes, or refused after. A KVPull waits the same way: an
// engine whose sidecar restarted makes its live grants again right after
// it registers its cache anew, and a decode's pull asked for that cache's
// shape may come between the two.
//
// Second, a peer's question about a KV cache not registered here yet. An
// engine whose sidecar restarted (or that restarted itself) registers its
// cache again a moment after it reconnects, and it may post a push ticket
// first: the prefill that takes it asks this sidecar for the cache's
// shape before pushing. Answering "no such cache" then would fail that
// push and have the engine recompute it. The question waits here instead,
// up to kvRegisterWait, and is answered as soon as the cache is
// registered, or "not found" after.
//
// Third, a peer's push ticket (PROTOCOL.md 9.19) for an inbox no engine
// here has opened yet. An engine whose sidecar restarted opens its inbox
// again a moment after it reconnects, and the decode's sidecar redials the
// restarted one as fast: a ticket between the two would be refused, and the
// decode would recompute. It waits here instead, up to inboxWait, and is
// queued as soon as an inbox opens, or refused after.

package proxy

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/stage-kv/stage/proxy/grant"
	"github.com/stage-kv/stage/wire"
)

const (
	// kvGrantWait is how long a push waits for its grant: a few of a
	// loaded engine's steps.
	kvGrantWait = 2 * time.Second
	// maxParked bounds the pushes a session holds for their grants; past
	// it they are refused at once.
	maxParked = 64
	// kvRegisterWait is how long a peer's KVInfoRequest waits for a cache
	// to be registered: an engine's reconnect and registration, well
	// inside the asker's kvInfoTimeout.
	kvRegisterWait = 2 * time.Second
	// maxInfoParked bounds the KVInfoRequests a session holds; past it
	// they are answered at once.
	maxInfoParked = 64
	// inboxWait is how long a peer's ticket waits for its inbox to open:
	// an engine's reconnect, well inside the poster's ticketWait.
	inboxWait = 2 * time.Second
	// maxTicketsParked bounds the tickets a session holds; past it they
	// are refused at once.
	maxTicketsParked = 64
)

// parkKVPush holds m, refused for want of a grant, until one admits it or
// kvGrantWait passed, on a goroutine of its own; false when it cannot
// wait (no key named, too many waiting): the caller refuses it.
func (s *Server) parkKVPush(ss *session, m *wire.KVAnnounce) bool {
	if len(m.Key) == 0 {
		return false // nothing a grant could come for
	}
	deadline := time.Now().Add(kvGrantWait)
	if !ss.in.park(m.Transfer, deadline, maxParked) {
		return false
	}
	s.wg.Go(func() {
		defer ss.in.unpark(m.Transfer)
		s.awaitGrant(ss, m, deadline)
	})
	return true
}

// awaitGrant admits m when a grant lets it, before deadline, or refuses it.
func (s *Server) awaitGrant(ss *session, m *wire.KVAnnounce, deadline time.Time) {
	ks, err := s.waitGrant(ss, deadline, func() (*kvSide, error) { return s.kv.admit(ss, &m.KVRequest, wire.AccessRemoteWrite) })
	s.openKVPush(ss, m, ks, err)
}

// waitGrant calls admit until it no longer lacks a grant (admitted, or
// refused for another reason) or deadline passed, looking again at each
// grant, and counts the wait; errSessionGone when the session ended first.
func (s *Server) waitGrant(ss *session, deadline time.Time, admit func() (*kvSide, error)) (*kvSide, error) {
	var ks *kvSide
	var err error
	if _, gone := s.waitFor(ss, "grant", time.Until(deadline), s.kv.grantSignal, func() bool {
		ks, err = admit()
		return !errors.Is(err, grant.ErrNoGrant)
	}); gone {
		return nil, errSessionGone
	}
	return ks, err
}

// waitFor calls try, and again at each close of signal(), until it says
// done or wait passed (then once more); the wait shows in the metrics
// under what. came: try said done; gone: the session ended first.
func (s *Server) waitFor(ss *session, what string, wait time.Duration, signal func() <-chan struct{}, try func() bool) (came, gone bool) {
	t := time.NewTimer(wait)
	defer t.Stop()
	s.metrics.kvWaitStarts(what)
	for {
		sig := signal() // before the try: a signal after it wakes us
		if try() {
			s.metrics.kvWaited(what, true)
			return true, false
		}
		select {
		case <-sig:
		case <-t.C:
			came = try()
			s.metrics.kvWaited(what, came)
			return came, false
		case <-ss.ctx.Done():
			s.metrics.kvWaitGone(what)
			return false, true
		}
	}
}

// park takes one of a session's max places for requests waiting (n
// counts them); false when none is left: the caller answers at once.
func park(n *atomic.Int32, max int32) bool {
	if n.Add(1) > max {
		n.Add(-1)
		return false
	}
	return true
}

// answerKVInfo answers a peer's KVInfoRequest: at once when the cache is
// registered (or too many questions wait already), else when it is, or
// after kvRegisterWait, on a goroutine of its own.
func (s *Server) answerKVInfo(ss *session, m *wire.KVInfoRequest) {
	if s.kv.get(m.Name) != nil || !park(&ss.infoParked, maxInfoParked) {
		s.kv.infoAsked(ss, m)
		return
	}
	s.wg.Go(func() {
		defer ss.infoParked.Add(-1)
		// answered after the wait too: "no KV cache" then
		if _, gone := s.waitFor(ss, "registration", kvRegisterWait, s.kv.regSignal, func() bool { return s.kv.get(m.Name) != nil }); !gone {
			s.kv.infoAsked(ss, m)
		}
	})
}

// ticketArrived queues a peer's ticket, come on ss, and answers it: at
// once (the event loop: it never blocks), or, when no inbox it could go to
// is open, once one opens or after inboxWait (the last refusal), on a
// goroutine of its own.
func (s *Server) ticketArrived(ss *session, m *wire.Ticket) {
	err := s.inboxes.deliver(ss.peerName, m)
	if errCode(err) != wire.CodeUnknownRegion || !park(&ss.ticketsParked, maxTicketsParked) {
		answerTicket(ss, m, err)
		return
	}
	s.wg.Go(func() {
		defer ss.ticketsParked.Add(-1)
		if _, gone := s.waitFor(ss, "inbox", inboxWait, s.inboxes.openSignal, func() bool {
			err = s.inboxes.deliver(ss.peerName, m)
			return errCode(err) != wire.CodeUnknownRegion
		}); !gone {
			answerTicket(ss, m, err)
		}
	})
}

// parkKVPull holds m, refused for want of a grant, until one admits it or
// kvGrantWait passed, on a goroutine of its own; false when it cannot
// wait (no key named, too many waiting): the caller refuses it.
func (s *Server) parkKVPull(ss *session, m *wire.KVPull) bool {
	if len(m.Key) == 0 || !park(&ss.pullParked, maxParked) {
		return false
	}
	s.wg.Go(func() {
		defer ss.pullParked.Add(-1)
		ks, err := s.waitGrant(ss, time.Now().Add(kvGrantWait), func() (*kvSide, error) {
			return s.kv.admit(ss, &m.KVRequest, wire.AccessRemoteRead)
		})
		if !errors.Is(err, errSessionGone) {
			s.serveKVPullAdmitted(ss, m, ks, err)
		}
	})
	return true
}
