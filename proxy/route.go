package proxy

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/wire"
)

// route keeps one session to each of its peers, redialing with backoff.
type route struct {
	cfg     config.Route
	mu      sync.Mutex
	sess    map[string]*session // by peer address
	lastErr map[string]error
	rr      int
	changed chan struct{} // closed and replaced whenever a session comes or goes
	cancel  context.CancelFunc
}

func (s *Server) addRoute(rc config.Route) {
	ctx, cancel := context.WithCancel(s.ctx)
	r := &route{cfg: rc, sess: map[string]*session{}, lastErr: map[string]error{}, changed: make(chan struct{}), cancel: cancel}
	s.mu.Lock()
	s.routes[rc.Name] = r
	s.mu.Unlock()
	for _, addr := range rc.Peers {
		s.wg.Add(1)
		go s.dialLoop(ctx, r, addr)
	}
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
				s.log.Warn("cannot reach peer; retrying", zap.String("route", r.cfg.Name), zap.String("addr", addr), zap.Error(err))
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
			ss.close(fmt.Errorf("route %s removed", r.cfg.Name))
			r.set(addr, nil, nil)
			return
		}
	}
}

// pick returns a live session of the route, round robin, waiting up to
// the route's connect timeout for one.
func (r *route) pick(ctx context.Context) (*session, error) {
	deadline := time.NewTimer(r.cfg.ConnectTimeout)
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
			return nil, codeErr(wire.CodePeerUnavailable, "route %q: no peer connected within %v (%s); is the peer's staged running and is security.token the same on both?", r.cfg.Name, r.cfg.ConnectTimeout, r.errSummary())
		}
	}
}

func (r *route) errSummary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	for _, addr := range r.cfg.Peers {
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
