// The sessions table: peer sessions live and being set up, and the
// sessions being dialed, counted against limits.max_sessions and
// limits.max_streams.

package proxy

import (
	"errors"
	"maps"
	"slices"
	"sync"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/wire"
)

// errShuttingDown refuses a session that would come up after Close
// took the table's last snapshot.
var errShuttingDown = errors.New("sidecar shutting down")

// sessionTable holds the peer sessions. Lock order: dialMu, then mu, then
// a session's own mu; mu is never held while a session's mu is taken.
type sessionTable struct {
	limits config.Limits
	// up tells the sender core of a session (coreUp); called
	// with mu held, so the core hears of a session before its close can
	// tell it the session went.
	up func(*session)

	mu   sync.Mutex
	live map[uint64]*session // control connection live: stats, heartbeats, routes see them
	// setup holds sessions we accepted whose Welcome is out but whose
	// control connection is not live yet (acceptSession): only accepted
	// looks here, so their data streams attach while nothing else sees a
	// session without a control connection.
	setup  map[uint64]*session
	closed bool // Close took its snapshot: no session comes up any more

	dialMu                    sync.Mutex
	dialSessions, dialStreams int // route sessions being dialed
}

func newSessionTable(limits config.Limits, up func(*session)) sessionTable {
	return sessionTable{limits: limits, up: up, live: map[uint64]*session{}, setup: map[uint64]*session{}}
}

// enlist makes a session we accepted known before its Welcome is written:
// the core hears of it, and accepted finds it, since the peer may open its
// data streams the moment it reads Welcome (PROTOCOL 8.3). Nothing else
// sees it until promote. The caller closes ss if anything fails after this.
func (t *sessionTable) enlist(ss *session) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errShuttingDown
	}
	t.up(ss)
	t.setup[ss.id] = ss
	return nil
}

// promote makes an established session live; the core hears of a dialed
// one here (an accepted one heard at enlist).
func (t *sessionTable) promote(ss *session) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errShuttingDown
	}
	if ss.dialer {
		t.up(ss)
	}
	delete(t.setup, ss.id)
	t.live[ss.id] = ss
	return nil
}

// remove forgets ss, live or being set up.
func (t *sessionTable) remove(ss *session) {
	t.mu.Lock()
	delete(t.live, ss.id)
	delete(t.setup, ss.id)
	t.mu.Unlock()
}

// closeAll returns every session, live or being set up, and lets none
// come up after: the caller closes them.
func (t *sessionTable) closeAll() []*session {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	return t.allLocked()
}

func (t *sessionTable) allLocked() []*session {
	all := make([]*session, 0, len(t.live)+len(t.setup))
	for _, m := range []map[uint64]*session{t.live, t.setup} {
		for _, ss := range m {
			all = append(all, ss)
		}
	}
	return all
}

// liveList is a snapshot of the sessions with a live control connection,
// to call into without the table's lock.
func (t *sessionTable) liveList() []*session {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Collect(maps.Values(t.live))
}

// revokeRegion tells every same-node peer that got r's handle that r is
// gone.
func (t *sessionTable) revokeRegion(r *region.Region) {
	for _, ss := range t.liveList() {
		ss.node.Revoke(r.ID)
	}
}

// byID is session id, live or being set up; nil when there is none.
func (t *sessionTable) byID(id uint64) *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ss := t.live[id]; ss != nil {
		return ss
	}
	return t.setup[id]
}

// count is the number of sessions, live or being set up.
func (t *sessionTable) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.live) + len(t.setup)
}

// accepted finds the session we accepted with id sid, live or still being
// set up (Welcome written, control connection not yet live).
func (t *sessionTable) accepted(sid [wire.SessionIDSize]byte) *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range []map[uint64]*session{t.live, t.setup} {
		for _, x := range m {
			if x.sid == sid && !x.dialer {
				return x
			}
		}
	}
	return nil
}

// load counts peer sessions (up or being set up) and their data streams
// (a dialed session's stripes; an accepted one's streams attached so far).
func (t *sessionTable) load() (sessions, streams int) {
	t.mu.Lock()
	all := t.allLocked()
	t.mu.Unlock()
	for _, ss := range all {
		streams += ss.streams.load(ss.dialer)
	}
	return len(all), streams
}

// reserve counts a session of stripes streams about to be dialed, or
// says which limit it would pass; release undoes it once the dial ended.
func (t *sessionTable) reserve(stripes int) error {
	t.dialMu.Lock()
	defer t.dialMu.Unlock()
	if err := t.roomLocked(stripes); err != nil {
		return err
	}
	t.dialSessions++
	t.dialStreams += stripes
	return nil
}

func (t *sessionTable) release(stripes int) {
	t.dialMu.Lock()
	t.dialSessions--
	t.dialStreams -= stripes
	t.dialMu.Unlock()
}

// room says whether one more session of stripes data streams fits in
// limits.max_sessions and limits.max_streams, counting those being dialed.
func (t *sessionTable) room(stripes int) error {
	t.dialMu.Lock()
	defer t.dialMu.Unlock()
	return t.roomLocked(stripes)
}

func (t *sessionTable) roomLocked(stripes int) error {
	sessions, streams := t.load()
	sessions, streams = sessions+t.dialSessions, streams+t.dialStreams
	l := t.limits
	if sessions >= l.MaxSessions {
		return codeErr(wire.CodeBusy, "limits.max_sessions (%d) reached: %d peer sessions up or being set up; raise it, or lower idle_timeout of routes with allow", l.MaxSessions, sessions)
	}
	if streams+stripes > l.MaxStreams {
		return codeErr(wire.CodeBusy, "limits.max_streams (%d) reached: %d data streams up, a session needs %d more; raise it or lower routes[].stripes", l.MaxStreams, streams, stripes)
	}
	return nil
}

// streamOffer is how many data streams an accepted session may open: at
// most want, within limits.max_streams.
func (t *sessionTable) streamOffer(want int) int {
	_, streams := t.load()
	return max(0, min(want, t.limits.MaxStreams-streams))
}
