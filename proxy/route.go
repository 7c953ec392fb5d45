package proxy

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/wire"
)

// route keeps one session to each of its peers, redialing with backoff.
// Its peers come from its config (static), from DNS (dnsroute.go), and
// from submits naming an allowed address (dynamic, dialed on demand); a
// peer that leaves is drained (peers.go). Its settings can change under it
// (hot reload); a change of stripes replaces it.
type route struct {
	name    string
	s       *Server
	cfg     atomic.Pointer[config.Route]
	ctx     context.Context // ends when the route is removed
	cancel  context.CancelFunc
	mu      sync.Mutex
	peers   map[string]*peer // by address, draining ones until they close
	rr      int
	changed chan struct{} // closed and replaced whenever a peer or session comes or goes
	dns     dnsWatch      // the DNS watcher of the current dns settings
	stats   routeStats
}

// conf is the route's current settings.
func (r *route) conf() *config.Route { return r.cfg.Load() }

func (s *Server) addRoute(rc config.Route) {
	ctx, cancel := context.WithCancel(s.ctx)
	r := &route{name: rc.Name, s: s, ctx: ctx, cancel: cancel, peers: map[string]*peer{}, changed: make(chan struct{})}
	r.cfg.Store(&rc)
	s.routeMu.Lock()
	s.routes[rc.Name] = r
	s.routeMu.Unlock()
	r.reconcile(nil)
	s.wg.Add(1)
	go r.janitor()
}

// removeRoute stops a route: its dialers exit and its sessions close,
// failing what is in flight on them.
func (s *Server) removeRoute(name string) {
	s.routeMu.Lock()
	r := s.routes[name]
	delete(s.routes, name)
	s.routeMu.Unlock()
	if r != nil {
		r.cancel()
	}
}

// ApplyRoutes makes the configured routes those of cfg (hot reload): new
// routes are dialed, removed ones closed, routes whose stripes changed are
// replaced, and routes whose other settings changed take them at once:
// peers added are dialed, peers removed are drained (their transfers in
// flight finish), and sessions to peers that stay, with their transfers,
// are not touched. Settings that need a restart are listed in the result.
func (s *Server) ApplyRoutes(cfg *config.Config) (added, removed, changed []string, restart []string) {
	want := map[string]config.Route{}
	for _, rc := range cfg.Routes {
		want[rc.Name] = rc
	}
	s.routeMu.Lock()
	have := map[string]*route{}
	for n, r := range s.routes {
		have[n] = r
	}
	s.routeMu.Unlock()
	for n := range have {
		if _, ok := want[n]; !ok {
			s.removeRoute(n)
			removed = append(removed, n)
		}
	}
	for n, rc := range want {
		r := have[n]
		switch {
		case r == nil:
			s.addRoute(rc)
			added = append(added, n)
		case r.conf().Stripes != rc.Stripes:
			s.removeRoute(n)
			s.addRoute(rc)
			changed = append(changed, n)
		case !reflect.DeepEqual(*r.conf(), rc):
			c := rc
			old := r.conf()
			r.cfg.Store(&c)
			r.reconcile(old)
			changed = append(changed, n)
		}
	}
	restart = restartKeys(s.cfg, cfg)
	sort.Strings(added)
	sort.Strings(removed)
	sort.Strings(changed)
	s.log.Info("routes reloaded", zap.Strings("added", added), zap.Strings("removed", removed), zap.Strings("changed", changed))
	if len(restart) > 0 {
		s.log.Warn("config changes that take effect only after a restart", zap.Strings("keys", restart))
	}
	return added, removed, changed, restart
}

// restartKeys lists the settings that differ between old and cfg and
// take effect only after a restart.
func restartKeys(old, cfg *config.Config) (restart []string) {
	if old.Listen != cfg.Listen {
		restart = append(restart, "listen")
	}
	if old.ControlSocket != cfg.ControlSocket {
		restart = append(restart, "control_socket")
	}
	if !reflect.DeepEqual(old.Device, cfg.Device) {
		restart = append(restart, "device")
	}
	if old.Staging != cfg.Staging {
		restart = append(restart, "staging")
	}
	if old.Security != cfg.Security {
		restart = append(restart, "security")
	}
	if old.Limits != cfg.Limits {
		restart = append(restart, "limits")
	}
	return restart
}

// set records a session of p coming (ss) or going (nil, with why). A
// peer whose session just went is being redialed, not down.
func (r *route) set(p *peer, ss *session, err error) {
	r.mu.Lock()
	p.sess, p.lastErr, p.down = ss, err, false
	if ss != nil {
		p.node, p.remote = ss.peerName, ss.remote
	}
	r.signalLocked()
	r.mu.Unlock()
}

// signalLocked wakes whoever waits for a peer or session (r.mu held).
func (r *route) signalLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// dialLoop keeps a session to p until p's context ends (the route is
// removed, or p drained) or p, drained, loses its session.
func (s *Server) dialLoop(r *route, p *peer) {
	defer s.wg.Done()
	defer r.forget(p)
	backoff := 50 * time.Millisecond
	logged := false
	for p.ctx.Err() == nil && !r.isDraining(p) {
		ss, err := s.dialPeer(r, p)
		if err != nil {
			r.dialFailed(p, err)
			if !logged || errCode(err) == wire.CodeAuthFailed {
				s.log.Warn("cannot reach peer; retrying", zap.String("route", r.name), zap.String("addr", p.addr), zap.Error(err))
				logged = true
			}
			if !p.sleep(backoff) {
				return
			}
			backoff = min(backoff*2, 2*time.Second)
			continue
		}
		backoff, logged = 50*time.Millisecond, false
		r.set(p, ss, nil)
		select {
		case <-ss.done:
			r.set(p, nil, ss.err)
		case <-p.ctx.Done():
			ss.close(fmt.Errorf("route %s: %s", r.name, r.leaving(p)))
			r.set(p, nil, nil)
			return
		}
	}
}

// dialPeer dials a session to p within limits.max_sessions and
// limits.max_streams.
func (s *Server) dialPeer(r *route, p *peer) (*session, error) {
	stripes := r.conf().Stripes
	if err := s.sessions.reserve(stripes); err != nil {
		return nil, err
	}
	defer s.sessions.release(stripes)
	return s.dial(p.ctx, r, p.addr)
}

// pick returns the live session of the peer a transfer names (want:
// node name or address; empty: the route's only peer, or any on a route
// with pick: any), waiting up to the route's connect timeout for it. A
// peer the route does not have is refused at once, before anything is
// dialed or moved; so is a peer that is down, after one fresh dial
// (down.go).
func (r *route) pick(ctx context.Context, want string) (*session, error) {
	deadline := time.NewTimer(r.conf().ConnectTimeout)
	defer deadline.Stop()
	var asked map[*peer]uint64 // peers down, asked to redial: their fails then
	for {
		ss, ch, err := r.choose(want)
		if err != nil {
			return nil, err
		}
		if ss != nil {
			return ss, nil
		}
		if r.allDown(want, &asked) {
			return nil, r.downErr(want)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline.C:
			return nil, r.unavailable(want)
		}
	}
}

// errNoSession is pickNow's answer when the peer has no session yet.
var errNoSession = errors.New("no session to the peer yet")

// pickNow is pick without waiting: errNoSession when pick would wait.
func (r *route) pickNow(want string) (*session, error) {
	ss, _, err := r.choose(want)
	if err == nil && ss == nil {
		return nil, errNoSession
	}
	return ss, err
}

// unavailable is the error of a submit that found no session in time.
func (r *route) unavailable(want string) error {
	r.mu.Lock()
	p, _ := r.matchLocked(want)
	list := r.listLocked()
	r.mu.Unlock()
	switch {
	case want == "":
		return codeErr(wire.CodePeerUnavailable, "route %q: no peer connected within %v (%s); is the peer's staged running and is security.token the same on both?", r.name, r.conf().ConnectTimeout, r.errSummary())
	case p == nil:
		r.stats.refusals[refuseUnknown].Add(1)
		return codeErr(wire.CodeUnknownPeer, "route %q has no peer %q (peers: %s)", r.name, want, list)
	}
	return codeErr(wire.CodePeerUnavailable, "route %q: peer %q not connected within %v (%s); is its staged running and is security.token the same on both?", r.name, want, r.conf().ConnectTimeout, r.errSummary())
}

func (r *route) errSummary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	for _, p := range r.sortedLocked() {
		switch {
		case p.draining:
		case p.lastErr != nil:
			parts = append(parts, p.addr+": "+p.lastErr.Error())
		case p.sess == nil:
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

// routeNames lists configured routes, for error messages.
func (s *Server) routeNames() string {
	s.routeMu.Lock()
	defer s.routeMu.Unlock()
	var names []string
	for n := range s.routes {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return "none configured"
	}
	return strings.Join(names, ", ")
}
