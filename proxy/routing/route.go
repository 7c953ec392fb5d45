package routing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// Route keeps one session to each of its peers, redialing with backoff.
// Its peers come from its config (static), from DNS (dns.go), and from
// submits naming an allowed address (dynamic, dialed on demand); a peer
// that leaves is drained (peers.go). Its settings can change under it
// (hot reload); a change of stripes replaces it.
type Route[S Session] struct {
	name    string
	t       *Table[S]
	cfg     atomic.Pointer[config.Route]
	ctx     context.Context // ends when the route is removed
	cancel  context.CancelFunc
	mu      sync.Mutex
	peers   map[string]*peer[S] // by address, draining ones until they close
	rr      int
	changed chan struct{} // closed and replaced whenever a peer or session comes or goes
	dns     dnsWatch      // the DNS watcher of the current dns settings
	stats   routeStats
}

func (t *Table[S]) newRoute(ctx context.Context, rc config.Route) *Route[S] {
	r := &Route[S]{name: rc.Name, t: t, peers: map[string]*peer[S]{}, changed: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(ctx)
	r.cfg.Store(&rc)
	return r
}

// Name is the route's name (routes[].name).
func (r *Route[S]) Name() string { return r.name }

// Conf is the route's current settings.
func (r *Route[S]) Conf() *config.Route { return r.cfg.Load() }

// set records a session of p coming (ss) or going (the zero S, with why).
// A peer whose session just went is being redialed, not down.
func (r *Route[S]) set(p *peer[S], ss S, err error) {
	r.mu.Lock()
	p.sess, p.lastErr, p.down = ss, err, false
	var none S
	if ss != none {
		p.node, p.remote = ss.Peer()
	}
	r.signalLocked()
	r.mu.Unlock()
}

// signalLocked wakes whoever waits for a peer or session (r.mu held).
func (r *Route[S]) signalLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// dialLoop keeps a session to p until p's context ends (the route is
// removed, or p drained) or p, drained, loses its session.
func (r *Route[S]) dialLoop(p *peer[S]) {
	defer r.t.wg.Done()
	defer r.forget(p)
	var none S
	backoff := Backoff{First: 50 * time.Millisecond, Max: 2 * time.Second}
	logged := false
	for p.ctx.Err() == nil && !r.isDraining(p) {
		ss, err := r.t.host.Dial(p.ctx, r, p.addr)
		if err != nil {
			r.dialFailed(p, err)
			if !logged || status.Code(err) == wire.CodeAuthFailed {
				r.t.log.Warn("cannot reach peer; retrying", zap.String("route", r.name), zap.String("addr", p.addr), zap.Error(err))
				logged = true
			}
			if !p.sleep(backoff.Next()) {
				return
			}
			continue
		}
		backoff.Reset()
		logged = false
		r.set(p, ss, nil)
		select {
		case <-ss.Done():
			r.set(p, none, ss.Err())
		case <-p.ctx.Done():
			ss.Close(fmt.Errorf("route %s: %s", r.name, r.leaving(p)))
			r.set(p, none, nil)
			return
		}
	}
}

// Pick returns the live session of the peer a transfer names (want: node
// name or address; empty: the route's only peer, or any on a route with
// pick: any), waiting up to the route's connect timeout for it. A peer
// the route does not have is refused at once, before anything is dialed
// or moved; so is a peer that is down, after one fresh dial (down.go).
func (r *Route[S]) Pick(ctx context.Context, want string) (S, error) {
	var none S
	deadline := time.NewTimer(r.Conf().ConnectTimeout)
	defer deadline.Stop()
	var asked map[*peer[S]]uint64 // peers down, asked to redial: their fails then
	for {
		ss, ch, err := r.choose(want)
		if err != nil || ss != none {
			return ss, err
		}
		if r.allDown(want, &asked) {
			return none, r.downErr(want)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return none, ctx.Err()
		case <-deadline.C:
			return none, r.unavailable(want)
		}
	}
}

// ErrNoSession is PickNow's answer when the peer has no session yet.
var ErrNoSession = errors.New("no session to the peer yet")

// PickNow is Pick without waiting: ErrNoSession when Pick would wait.
func (r *Route[S]) PickNow(want string) (S, error) {
	ss, _, err := r.choose(want)
	var none S
	if err == nil && ss == none {
		return none, ErrNoSession
	}
	return ss, err
}

// unavailable is the error of a submit that found no session in time.
func (r *Route[S]) unavailable(want string) error {
	r.mu.Lock()
	p, _ := r.matchLocked(want)
	list := r.listLocked()
	r.mu.Unlock()
	switch {
	case want == "":
		return status.Errorf(wire.CodePeerUnavailable, "route %q: no peer connected within %v (%s); is the peer's staged running and is security.token the same on both?", r.name, r.Conf().ConnectTimeout, r.ErrSummary())
	case p == nil:
		r.stats.refusals[refuseUnknown].Add(1)
		return status.Errorf(wire.CodeUnknownPeer, "route %q has no peer %q (peers: %s)", r.name, want, list)
	}
	return status.Errorf(wire.CodePeerUnavailable, "route %q: peer %q not connected within %v (%s); is its staged running and is security.token the same on both?", r.name, want, r.Conf().ConnectTimeout, r.ErrSummary())
}

// ErrSummary says why the route's peers are not up: each one's last dial
// error, or that it is not connected yet.
func (r *Route[S]) ErrSummary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	for _, p := range r.sortedLocked() {
		switch {
		case p.draining:
		case p.lastErr != nil:
			parts = append(parts, p.addr+": "+p.lastErr.Error())
		case !p.up():
			parts = append(parts, p.addr+": not connected yet")
		}
	}
	if len(parts) == 0 {
		parts = append(parts, "no peers yet")
		if e := r.dns.err; e != nil {
			parts = append(parts, "dns: "+e.Error())
		}
	}
	return strings.Join(parts, "; ")
}

// Info describes the route and its peers for stagectl routes; fill adds
// what only the sidecar knows of a peer's session, called without the
// route's lock.
func (r *Route[S]) Info(fill func(ss S, pi *wire.PeerInfo)) wire.RouteInfo {
	c := r.Conf()
	ri := wire.RouteInfo{Name: c.Name, Transport: c.Transport, Stripes: c.Stripes, Checksum: c.Checksum,
		Pick: c.Pick, DNS: c.DNS, Allow: c.Allow, DNSError: r.dnsError()}
	r.mu.Lock()
	ps := r.sortedLocked()
	sess := make([]S, len(ps))
	ri.Peers = make([]wire.PeerInfo, len(ps))
	for i, p := range ps {
		sess[i] = p.sess
		ri.Peers[i] = wire.PeerInfo{Addr: p.addr, State: p.state(), Node: p.node, Found: p.found}
		if p.lastErr != nil {
			ri.Peers[i].Error = p.lastErr.Error()
		}
	}
	r.mu.Unlock()
	var none S
	for i, ss := range sess {
		if ss != none {
			ri.Peers[i].Sessions, ri.Peers[i].InFlight = 1, r.t.host.Busy(ss)
			fill(ss, &ri.Peers[i])
		}
	}
	return ri
}
