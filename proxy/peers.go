// A route's peers: how a submit's peer name resolves to a session, peers
// dialed on demand within the route's allow list, and draining a peer
// that leaves (reload, DNS) without cutting its transfers short.

package proxy

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/wire"
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
type peer struct {
	addr     string
	found    string
	node     string // node name of its last session (the handshake's)
	remote   string // ip:port its last session reached
	sess     *session
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

// state is the peer's state as stagectl routes shows it.
func (p *peer) state() string {
	switch {
	case p.draining:
		return "draining"
	case p.sess != nil:
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
func (r *route) addPeerLocked(addr, found string) *peer {
	if p := r.peers[addr]; p != nil && p.ctx.Err() == nil {
		if p.draining {
			p.draining, p.found, p.why = false, found, ""
			r.s.log.Info("peer back in route", zap.String("route", r.name), zap.String("addr", addr), zap.String("found", found))
		} else if rank(found) > rank(p.found) {
			p.found = found
		}
		r.signalLocked()
		return p
	}
	p := &peer{addr: addr, found: found, kick: make(chan struct{}, 1)}
	p.ctx, p.cancel = context.WithCancel(r.ctx)
	p.lastUse.Store(time.Now().UnixNano())
	r.peers[addr] = p
	r.stats.added.Add(1)
	r.signalLocked()
	r.s.wg.Add(1)
	go r.s.dialLoop(r, p)
	return p
}

// drainLocked takes p out of the route: no submit picks it any more, and
// its session closes once nothing is in flight on it, or after twice the
// progress timeout, when whatever is left fails (r.mu held).
func (r *route) drainLocked(p *peer, why string) {
	if p.draining {
		return
	}
	p.draining, p.why = true, why
	r.stats.drained.Add(1)
	r.signalLocked()
	r.s.log.Info("draining peer", zap.String("route", r.name), zap.String("addr", p.addr), zap.String("node", p.node), zap.String("why", why))
	r.s.wg.Add(1)
	go r.drainWait(p)
}

func (r *route) drainWait(p *peer) {
	defer r.s.wg.Done()
	limit := time.Now().Add(2*r.conf().ProgressTimeout + r.conf().ConnectTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		r.mu.Lock()
		draining, ss := p.draining, p.sess
		r.mu.Unlock()
		if !draining {
			return // revived
		}
		if ss == nil || r.s.busyOn(ss) == 0 || time.Now().After(limit) {
			p.cancel()
			return
		}
		select {
		case <-p.ctx.Done():
			return
		case <-ss.done:
		case <-tick.C:
		}
	}
}

// isDraining reports whether p left the route.
func (r *route) isDraining(p *peer) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return p.draining
}

// leaving says why p's session is closed on purpose.
func (r *route) leaving(p *peer) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p.draining {
		return fmt.Sprintf("peer %s left the route (%s)", p.addr, p.why)
	}
	return "route removed"
}

// forget drops p once its dial loop ended.
func (r *route) forget(p *peer) {
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
func (r *route) reconcile(old *config.Route) {
	rc := r.conf()
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
func (r *route) janitor() {
	defer r.s.wg.Done()
	for {
		idle := r.conf().IdleTimeout
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
// in flight. Their load is counted outside r.mu (busyOn takes the tables' and sessions' locks).
func (r *route) closeIdle(now time.Time, idle time.Duration) {
	idleSince := func(p *peer) bool { return now.Sub(time.Unix(0, p.lastUse.Load())) >= idle }
	r.mu.Lock()
	var idlers []*peer
	var sess []*session
	for _, p := range r.sortedLocked() {
		if p.found == foundDynamic && !p.draining && idleSince(p) {
			idlers, sess = append(idlers, p), append(sess, p.sess)
		}
	}
	r.mu.Unlock()
	for i, p := range idlers {
		if sess[i] != nil && r.s.busyOn(sess[i]) > 0 {
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
func (r *route) sortedLocked() []*peer {
	ps := make([]*peer, 0, len(r.peers))
	for _, p := range r.peers {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].addr < ps[j].addr })
	return ps
}

// activeLocked is the peers submits may pick: all but draining ones.
func (r *route) activeLocked() []*peer {
	ps := r.sortedLocked()
	return slices.DeleteFunc(ps, func(p *peer) bool { return p.draining })
}

// choose resolves want to a live session (ss), or says to wait for a
// change (ch), or refuses (err) (peers.go's rules: see route.pick).
func (r *route) choose(want string) (*session, <-chan struct{}, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := r.changed
	active := r.activeLocked()
	if want == "" {
		if r.conf().Pick == config.PickAny {
			var live []*peer
			for _, p := range active {
				if p.sess != nil {
					live = append(live, p)
				}
			}
			if len(live) == 0 {
				return nil, ch, nil
			}
			r.rr++
			return r.use(live[r.rr%len(live)]), nil, nil
		}
		switch len(active) {
		case 0:
			return nil, ch, nil
		case 1:
			if active[0].sess == nil {
				return nil, ch, nil
			}
			return r.use(active[0]), nil, nil
		}
		r.stats.refusals[refuseNoPeer].Add(1)
		return nil, nil, codeErr(wire.CodeBadRequest, "route %q has %d peers and the transfer names none: name one (peer=node name or host:port), or set pick: any on the route if any will do (peers: %s)", r.name, len(active), r.listLocked())
	}
	p, err := r.matchLocked(want)
	if err != nil {
		r.stats.refusals[refuseNoPeer].Add(1)
		return nil, nil, err
	}
	if p != nil {
		p.lastUse.Store(time.Now().UnixNano())
		if p.sess == nil {
			return nil, ch, nil
		}
		return r.use(p), nil, nil
	}
	if isAddr(want) {
		if !r.allowed(want) {
			r.stats.refusals[refuseNotAllowed].Add(1)
			return nil, nil, codeErr(wire.CodeAccessDenied, "route %q: peer %q is none of its peers and not in its allow list (%s); nothing was dialed (peers: %s)", r.name, want, allowList(r.conf().Allow), r.listLocked())
		}
		if err := r.s.sessions.room(r.conf().Stripes); err != nil {
			r.stats.refusals[refuseLimit].Add(1)
			return nil, nil, err
		}
		r.addPeerLocked(want, foundDynamic)
		return nil, r.changed, nil
	}
	for _, p := range active {
		if p.node == "" {
			return nil, ch, nil // want may be the node name of a peer still connecting
		}
	}
	r.stats.refusals[refuseUnknown].Add(1)
	return nil, nil, codeErr(wire.CodeUnknownPeer, "route %q has no peer %q (peers: %s)", r.name, want, r.listLocked())
}

// use notes that a submit picked p and returns its session (r.mu held).
func (r *route) use(p *peer) *session {
	p.lastUse.Store(time.Now().UnixNano())
	return p.sess
}

// matchLocked finds the active peer want names: by address (as
// configured or as connected), else by node name. Several peers of one
// node name is ambiguous unless exactly one of them is up.
func (r *route) matchLocked(want string) (*peer, error) {
	if want == "" {
		return nil, nil
	}
	var byNode []*peer
	for _, p := range r.activeLocked() {
		if p.addr == want || p.remote == want {
			return p, nil
		}
		if p.node == want {
			byNode = append(byNode, p)
		}
	}
	if len(byNode) <= 1 {
		if len(byNode) == 1 {
			return byNode[0], nil
		}
		return nil, nil
	}
	live := slices.DeleteFunc(slices.Clone(byNode), func(p *peer) bool { return p.sess == nil })
	if len(live) == 1 {
		return live[0], nil
	}
	var addrs []string
	for _, p := range byNode {
		addrs = append(addrs, p.addr)
	}
	return nil, codeErr(wire.CodeBadRequest, "route %q: %d peers have node name %q (%s); name one by address", r.name, len(byNode), want, strings.Join(addrs, ", "))
}

// listLocked names the active peers for an error: node name, address and
// state, at most 16 of them.
func (r *route) listLocked() string {
	active := r.activeLocked()
	if len(active) == 0 {
		return "none"
	}
	var parts []string
	for i, p := range active {
		if i == 16 {
			parts = append(parts, fmt.Sprintf("and %d more: stagectl routes", len(active)-i))
			break
		}
		name := p.addr
		if p.node != "" {
			name = p.node + " at " + p.addr
		}
		parts = append(parts, name+" ("+p.state()+")")
	}
	return strings.Join(parts, ", ")
}

// isAddr reports whether a peer name is a host:port rather than a node name.
func isAddr(s string) bool {
	host, port, err := net.SplitHostPort(s)
	return err == nil && host != "" && port != ""
}

// allowed reports whether the route's allow list covers addr (host:port):
// its host an IP inside one of the CIDR ranges, or a DNS name ending in
// one of the suffixes. Nothing is resolved.
func (r *route) allowed(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	return allowHost(r.conf().Allow, host)
}

func allowHost(allow []string, host string) bool {
	ip := net.ParseIP(host)
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	for _, a := range allow {
		if _, n, err := net.ParseCIDR(a); err == nil {
			if ip != nil && n.Contains(ip) {
				return true
			}
			continue
		}
		if ip != nil || name == "" {
			continue
		}
		suf := strings.TrimSuffix(strings.ToLower(strings.TrimPrefix(a, ".")), ".")
		if name == suf || strings.HasSuffix(name, "."+suf) {
			return true
		}
	}
	return false
}

func allowList(allow []string) string {
	if len(allow) == 0 {
		return "empty"
	}
	return strings.Join(allow, ", ")
}

// busyOn counts what is in flight on ss: the engine's transfers on it,
// the pulls it serves, and the peer's pushes arriving on it.
func (s *Server) busyOn(ss *session) int {
	n := s.xfers.running(ss) + s.outs.served(ss)
	ss.mu.Lock()
	n += len(ss.in) + len(ss.inline)
	ss.mu.Unlock()
	return n
}

// peerInfos describes the route's peers for stagectl routes.
func (r *route) peerInfos() []PeerInfo {
	s := r.s
	r.mu.Lock()
	ps := r.sortedLocked()
	type row struct {
		p  *peer
		ss *session
		pi PeerInfo
	}
	rows := make([]row, len(ps))
	for i, p := range ps {
		rows[i] = row{p: p, ss: p.sess, pi: PeerInfo{Addr: p.addr, State: p.state(), Node: p.node, Found: p.found}}
		if p.lastErr != nil {
			rows[i].pi.Error = p.lastErr.Error()
		}
	}
	r.mu.Unlock()
	out := make([]PeerInfo, 0, len(rows))
	for _, x := range rows {
		pi := x.pi
		if ss := x.ss; ss != nil {
			pi.Sessions, pi.SameHost, pi.Stripes, pi.Chunk = 1, ss.sameHost(), ss.stripeCount(), ss.chunkSize
			pi.StreamsUp = ss.streamsUp()
			pi.InFlight = s.busyOn(ss)
			pi.Transport = ss.node.TransportOf(r.conf().Transport)
		}
		out = append(out, pi)
	}
	return out
}
