// A route's peers: how a submit's peer name resolves to a session, peers
// dialed on demand within the route's allow list, and draining a peer
// that leaves (reload, DNS) without cutting its transfers short.

package routing

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/config"
)

// How a route found a peer. A peer found more than one way keeps the
// strongest: static over dns over dynamic.
const (
	foundStatic  = "static"
	foundDNS     = "dns"
	foundDynamic = "dynamic"
)

// peer is one address a route dials. Its fields are guarded by the
// route's mu, but for ctx, cancel and lastUse.
type peer[S Session] struct {
	addr     string
	found    string
	node     string // node name of its last session (the handshake's)
	remote   string // ip:port its last session reached
	sess     S      // the zero S: no session
	lastErr  error
	draining bool   // left the route: no new transfers; closes when idle
	why      string // why it is draining
	down     bool   // its last dial failed and no session came since (down.go)
	fails    uint64 // dial attempts that failed, ever
	kick     chan struct{}
	ctx      context.Context
	cancel   context.CancelFunc
	lastUse  atomic.Int64 // unix nanos of the last submit that named it
}

// up reports whether p has a session.
func (p *peer[S]) up() bool {
	var none S
	return p.sess != none
}

// state is the peer's state as stagectl routes shows it.
func (p *peer[S]) state() string {
	switch {
	case p.draining:
		return "draining"
	case p.up():
		return "up"
	case p.down:
		return "down"
	}
	return "connecting" // first dial, or redialing after its session closed
}

// rank orders how a peer was found: a stronger way is kept.
func rank(found string) int {
	switch found {
	case foundStatic:
		return 3
	case foundDNS:
		return 2
	}
	return 1
}

// addPeerLocked makes addr a peer found as found, dialing it, or revives
// it when it was draining (r.mu held).
func (r *Route[S]) addPeerLocked(addr, found string) *peer[S] {
	if p := r.peers[addr]; p != nil && p.ctx.Err() == nil {
		if p.draining {
			p.draining, p.found, p.why = false, found, ""
			r.t.log.Info("peer back in route", zap.String("route", r.name), zap.String("addr", addr), zap.String("found", found))
		} else if rank(found) > rank(p.found) {
			p.found = found
		}
		r.signalLocked()
		return p
	}
	p := &peer[S]{addr: addr, found: found, kick: make(chan struct{}, 1)}
	p.ctx, p.cancel = context.WithCancel(r.ctx)
	p.lastUse.Store(time.Now().UnixNano())
	r.peers[addr] = p
	r.stats.added.Add(1)
	r.signalLocked()
	r.t.wg.Add(1)
	go r.dialLoop(p)
	return p
}

// drainLocked takes p out of the route: no submit picks it any more, and
// its session closes once nothing is in flight on it, or after twice the
// progress timeout, when whatever is left fails (r.mu held).
func (r *Route[S]) drainLocked(p *peer[S], why string) {
	if p.draining {
		return
	}
	p.draining, p.why = true, why
	r.stats.drained.Add(1)
	r.signalLocked()
	r.t.log.Info("draining peer", zap.String("route", r.name), zap.String("addr", p.addr), zap.String("node", p.node), zap.String("why", why))
	r.t.wg.Add(1)
	go r.drainWait(p)
}

func (r *Route[S]) drainWait(p *peer[S]) {
	defer r.t.wg.Done()
	limit := time.Now().Add(2*r.Conf().ProgressTimeout + r.Conf().ConnectTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		r.mu.Lock()
		draining, ss := p.draining, p.sess
		r.mu.Unlock()
		if !draining {
			return // revived
		}
		if !p.up() || r.t.host.Busy(ss) == 0 || time.Now().After(limit) {
			p.cancel()
			return
		}
		select {
		case <-p.ctx.Done():
			return
		case <-ss.Done():
		case <-tick.C:
		}
	}
}

// isDraining reports whether p left the route.
func (r *Route[S]) isDraining(p *peer[S]) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return p.draining
}

// leaving says why p's session is closed on purpose.
func (r *Route[S]) leaving(p *peer[S]) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p.draining {
		return fmt.Sprintf("peer %s left the route (%s)", p.addr, p.why)
	}
	return "route removed"
}

// forget drops p once its dial loop ended.
func (r *Route[S]) forget(p *peer[S]) {
	p.cancel()
	r.mu.Lock()
	if r.peers[p.addr] == p {
		delete(r.peers, p.addr)
		r.signalLocked()
	}
	r.mu.Unlock()
}

// reconcile makes the static peers those of the config, drains dynamic
// peers the allow list no longer covers, and (re)starts the DNS watcher
// when its settings changed (old: the settings before; nil at start).
func (r *Route[S]) reconcile(old *config.Route) {
	rc := r.Conf()
	r.mu.Lock()
	for _, addr := range rc.Peers {
		r.addPeerLocked(addr, foundStatic)
	}
	for _, p := range r.sortedLocked() {
		if p.draining {
			continue
		}
		switch {
		case p.found == foundStatic && !slices.Contains(rc.Peers, p.addr):
			if rc.DNS != "" && r.dns.addrs[p.addr] {
				p.found = foundDNS
			} else {
				r.drainLocked(p, "removed from routes[].peers")
			}
		case p.found == foundDynamic && !r.allowed(p.addr):
			r.drainLocked(p, "no longer in routes[].allow")
		}
	}
	r.mu.Unlock()
	if old == nil || old.DNS != rc.DNS || old.DNSInterval != rc.DNSInterval || old.DNSServer != rc.DNSServer {
		r.watchDNS()
	}
}

// janitor drains peers dialed on demand that carried nothing for the
// route's idle_timeout.
func (r *Route[S]) janitor() {
	defer r.t.wg.Done()
	for {
		idle := r.Conf().IdleTimeout
		if idle <= 0 {
			idle = config.DefaultRouteIdleTimeout
		}
		t := time.NewTimer(min(max(idle/4, 10*time.Millisecond), time.Second))
		select {
		case <-r.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		r.closeIdle(time.Now(), idle)
	}
}

// closeIdle drains the dynamic peers unused since now-idle with nothing
// in flight. Their load is counted outside r.mu (the host's Busy takes
// the sidecar's locks).
func (r *Route[S]) closeIdle(now time.Time, idle time.Duration) {
	var none S
	idleSince := func(p *peer[S]) bool { return now.Sub(time.Unix(0, p.lastUse.Load())) >= idle }
	r.mu.Lock()
	var idlers []*peer[S]
	var sess []S
	for _, p := range r.sortedLocked() {
		if p.found == foundDynamic && !p.draining && idleSince(p) {
			idlers, sess = append(idlers, p), append(sess, p.sess)
		}
	}
	r.mu.Unlock()
	for i, p := range idlers {
		if sess[i] != none && r.t.host.Busy(sess[i]) > 0 {
			continue
		}
		r.mu.Lock()
		if p.found == foundDynamic && idleSince(p) && p.sess == sess[i] {
			r.drainLocked(p, fmt.Sprintf("idle for %v (routes[].idle_timeout)", idle))
		}
		r.mu.Unlock()
	}
}

// sortedLocked is the route's peers by address (r.mu held).
func (r *Route[S]) sortedLocked() []*peer[S] {
	ps := make([]*peer[S], 0, len(r.peers))
	for _, p := range r.peers {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].addr < ps[j].addr })
	return ps
}

// activeLocked is the peers submits may pick: all but draining ones.
func (r *Route[S]) activeLocked() []*peer[S] {
	ps := r.sortedLocked()
	return slices.DeleteFunc(ps, func(p *peer[S]) bool { return p.draining })
}
