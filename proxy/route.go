package proxy

import (
	"context"
	"fmt"
	"reflect"
	"slices"
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
// Its settings can change under it (hot reload); its name and peers cannot
// (a reload that changes them replaces the route).
type route struct {
	name    string
	cfg     atomic.Pointer[config.Route]
	mu      sync.Mutex
	sess    map[string]*session // by peer address
	lastErr map[string]error
	rr      int
	changed chan struct{} // closed and replaced whenever a session comes or goes
	cancel  context.CancelFunc
}

// conf is the route's current settings.
func (r *route) conf() *config.Route { return r.cfg.Load() }

func (s *Server) addRoute(rc config.Route) {
	ctx, cancel := context.WithCancel(s.ctx)
	r := &route{name: rc.Name, sess: map[string]*session{}, lastErr: map[string]error{}, changed: make(chan struct{}), cancel: cancel}
	r.cfg.Store(&rc)
	s.mu.Lock()
	s.routes[rc.Name] = r
	s.mu.Unlock()
	for _, addr := range rc.Peers {
		s.wg.Add(1)
		go s.dialLoop(ctx, r, addr)
	}
}

// removeRoute stops a route: its dialers exit and its sessions close,
// failing what is in flight on them.
func (s *Server) removeRoute(name string) {
	s.mu.Lock()
	r := s.routes[name]
	delete(s.routes, name)
	s.mu.Unlock()
	if r != nil {
		r.cancel()
	}
}

// ApplyRoutes makes the configured routes those of cfg (hot reload): new
// routes are dialed, removed ones closed, routes whose peers or stripes
// changed are replaced, and routes whose other settings changed take them
// at once. Routes that stay as they were are not touched, nor are the
// transfers on them. Settings that need a restart are listed in the result.
func (s *Server) ApplyRoutes(cfg *config.Config) (added, removed, changed []string, restart []string) {
	want := map[string]config.Route{}
	for _, rc := range cfg.Routes {
		want[rc.Name] = rc
	}
	s.mu.Lock()
	have := map[string]*route{}
	for n, r := range s.routes {
		have[n] = r
	}
	s.mu.Unlock()
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
		case !slices.Equal(r.conf().Peers, rc.Peers) || r.conf().Stripes != rc.Stripes:
			s.removeRoute(n)
			s.addRoute(rc)
			changed = append(changed, n)
		case !reflect.DeepEqual(*r.conf(), rc):
			c := rc
			r.cfg.Store(&c)
			changed = append(changed, n)
		}
	}
	old := s.cfg
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
	sort.Strings(added)
	sort.Strings(removed)
	sort.Strings(changed)
	s.log.Info("routes reloaded", zap.Strings("added", added), zap.Strings("removed", removed), zap.Strings("changed", changed))
	if len(restart) > 0 {
		s.log.Warn("config changes that take effect only after a restart", zap.Strings("keys", restart))
	}
	return added, removed, changed, restart
}

func (r *route) set(addr string, ss *session, err error) {
	r.mu.Lock()
	if ss != nil {
		r.sess[addr] = ss
	} else {
		delete(r.sess, addr)
	}
	r.lastErr[addr] = err
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (s *Server) dialLoop(ctx context.Context, r *route, addr string) {
	defer s.wg.Done()
	backoff := 50 * time.Millisecond
	logged := false
	for ctx.Err() == nil {
		ss, err := s.dial(ctx, r, addr)
		if err != nil {
			r.set(addr, nil, err)
			if !logged || errCode(err) == wire.CodeAuthFailed {
				s.log.Warn("cannot reach peer; retrying", zap.String("route", r.conf().Name), zap.String("addr", addr), zap.Error(err))
				logged = true
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 2*time.Second)
			continue
		}
		backoff, logged = 50*time.Millisecond, false
		r.set(addr, ss, nil)
		select {
		case <-ss.done:
			r.set(addr, nil, ss.err)
		case <-ctx.Done():
			ss.close(fmt.Errorf("route %s removed", r.conf().Name))
			r.set(addr, nil, nil)
			return
		}
	}
}

// pick returns a live session of the route, round robin, waiting up to
// the route's connect timeout for one.
func (r *route) pick(ctx context.Context) (*session, error) {
	deadline := time.NewTimer(r.conf().ConnectTimeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		live := make([]*session, 0, len(r.sess))
		for _, ss := range r.sess {
			live = append(live, ss)
		}
		ch := r.changed
		r.mu.Unlock()
		if len(live) > 0 {
			sort.Slice(live, func(i, j int) bool { return live[i].addr < live[j].addr })
			r.mu.Lock()
			r.rr++
			ss := live[r.rr%len(live)]
			r.mu.Unlock()
			return ss, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline.C:
			return nil, codeErr(wire.CodePeerUnavailable, "route %q: no peer connected within %v (%s); is the peer's staged running and is security.token the same on both?", r.conf().Name, r.conf().ConnectTimeout, r.errSummary())
		}
	}
}

func (r *route) errSummary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	for _, addr := range r.conf().Peers {
		if e := r.lastErr[addr]; e != nil {
			parts = append(parts, addr+": "+e.Error())
		} else {
			parts = append(parts, addr+": not connected yet")
		}
	}
	return strings.Join(parts, "; ")
}

// routeNames lists configured routes, for error messages.
func (s *Server) routeNames() string {
	s.mu.Lock()
	defer s.mu.Unlock()
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
