// A peer known to be down: a submit that names it is refused after one
// fresh dial fails, instead of waiting out the route's connect_timeout.
// An engine whose decode peer died wants to hear so in milliseconds and
// recompute or pick another peer; waiting seconds stalls its request.
// A peer still connecting (at start, or redialing right after its session
// closed) is waited for as before, and a peer in redial backoff is
// redialed at once, so one that came back is not refused for the rest of
// its backoff.

package routing

import (
	"strconv"
	"time"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// minRedial is the least time between two dials of one peer, however
// many submits ask for it.
const minRedial = 50 * time.Millisecond

// dialFailed records that a dial of p failed with err: p is down.
func (r *Route[S]) dialFailed(p *peer[S], err error) {
	r.mu.Lock()
	var none S
	p.sess, p.lastErr, p.down = none, err, true
	p.fails++
	r.signalLocked()
	r.mu.Unlock()
}

// sleep waits out a dial backoff of d, cut short when a submit asks for
// the peer (kick) once minRedial has passed. It is false when p's
// context ended.
func (p *peer[S]) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	floor := time.NewTimer(min(minRedial, d))
	defer floor.Stop()
	var kick <-chan struct{}
	for {
		select {
		case <-p.ctx.Done():
			return false
		case <-t.C:
			return true
		case <-floor.C:
			kick = p.kick
		case <-kick:
			return true
		}
	}
}

// allDown reports whether every peer that could serve want is down and
// has failed a dial since this submit first found it down (asked holds
// each such peer's failure count then; the first time, the peer is asked
// to redial). A peer up, connecting, or not yet dialed again says wait.
func (r *Route[S]) allDown(want string, asked *map[*peer[S]]uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	cands := r.candidatesLocked(want)
	if len(cands) == 0 {
		return false
	}
	settled := true
	for _, p := range cands {
		if p.up() || !p.down {
			return false
		}
		if *asked == nil {
			*asked = map[*peer[S]]uint64{}
		}
		base, ok := (*asked)[p]
		if !ok {
			(*asked)[p] = p.fails
			select {
			case p.kick <- struct{}{}:
			default:
			}
			settled = false
			continue
		}
		if p.fails == base {
			settled = false
		}
	}
	return settled
}

// candidatesLocked is the peers a submit naming want may use: the one it
// names, or with no name the route's peers (choose has already refused
// an unnamed submit on a route of several without pick: any). None when
// want names no peer yet (one being added, or a node name still
// connecting): then the submit waits (r.mu held).
func (r *Route[S]) candidatesLocked(want string) []*peer[S] {
	if want == "" {
		active := r.activeLocked()
		if len(active) == 1 || r.Conf().Pick == config.PickAny {
			return active
		}
		return nil
	}
	p, err := r.matchLocked(want)
	if err != nil || p == nil {
		return nil
	}
	return []*peer[S]{p}
}

// downErr is the error of a submit refused because its peer is down.
func (r *Route[S]) downErr(want string) error {
	r.stats.refusals[refuseDown].Add(1)
	name := "of the route"
	if want != "" {
		name = strconv.Quote(want)
	}
	return status.Errorf(wire.CodePeerUnavailable, "route %q: peer %s is down (%s); refused at once, not after connect_timeout; is its staged running and reachable?", r.name, name, r.ErrSummary())
}
