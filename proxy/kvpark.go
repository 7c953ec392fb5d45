// A peer's KV push that came before its grant (PROTOCOL.md 9.20). An
// engine receiving pushes hands the pusher a transfer key and grants it on
// its cache, and the two may travel apart: vLLM's scheduler posts the push
// ticket while its worker grants at the next step, so the push may reach
// this sidecar first. Refusing it then would have the engine recompute
// what was on its way. A KVAnnounce that names a key no live grant holds
// yet waits here instead, up to kvGrantWait, and is admitted as soon as
// a grant comes, or refused after.

package proxy

import (
	"errors"
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
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for {
		granted := s.kv.grantSignal() // before the check: a grant after it wakes us
		ks, err := s.kv.admit(ss, &m.KVRequest, wire.AccessRemoteWrite)
		if err == nil || !errors.Is(err, grant.ErrNoGrant) || !time.Now().Before(deadline) {
			s.openKVPush(ss, m, ks, err)
			return
		}
		select {
		case <-granted:
		case <-t.C:
		case <-ss.ctx.Done():
			s.refusePush(ss, m.Transfer, errSessionGone)
			return
		}
	}
}
