// Which peer a submit gets: the rules that resolve a peer name (node
// name, address, or none) to a session, refuse a name the route cannot
// serve, and add an allowed address as a peer dialed on demand.

package routing

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// choose resolves want to a live session (ss), or says to wait for a
// change (ch), or refuses (err) (peers.go's rules: see route.pick).
func (r *Route[S]) choose(want string) (S, <-chan struct{}, error) {
	var none S
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := r.changed
	active := r.activeLocked()
	if want == "" {
		if r.Conf().Pick == config.PickAny {
			var live []*peer[S]
			for _, p := range active {
				if p.up() {
					live = append(live, p)
				}
			}
			if len(live) == 0 {
				return none, ch, nil
			}
			r.rr++
			return r.use(live[r.rr%len(live)]), nil, nil
		}
		switch len(active) {
		case 0:
			return none, ch, nil
		case 1:
			if !active[0].up() {
				return none, ch, nil
			}
			return r.use(active[0]), nil, nil
		}
		r.stats.refusals[refuseNoPeer].Add(1)
		return none, nil, status.Errorf(wire.CodeBadRequest, "route %q has %d peers and the transfer names none: name one (peer=node name or host:port), or set pick: any on the route if any will do (peers: %s)", r.name, len(active), r.listLocked())
	}
	p, err := r.matchLocked(want)
	if err != nil {
		r.stats.refusals[refuseNoPeer].Add(1)
		return none, nil, err
	}
	if p != nil {
		p.lastUse.Store(time.Now().UnixNano())
		if !p.up() {
			return none, ch, nil
		}
		return r.use(p), nil, nil
	}
	if isAddr(want) {
		if !r.allowed(want) {
			r.stats.refusals[refuseNotAllowed].Add(1)
			return none, nil, status.Errorf(wire.CodeAccessDenied, "route %q: peer %q is none of its peers and not in its allow list (%s); nothing was dialed (peers: %s)", r.name, want, allowList(r.Conf().Allow), r.listLocked())
		}
		if err := r.t.host.Room(r.Conf().Stripes); err != nil {
			r.stats.refusals[refuseLimit].Add(1)
			return none, nil, err
		}
		r.addPeerLocked(want, foundDynamic)
		return none, r.changed, nil
	}
	for _, p := range active {
		if p.node == "" {
			return none, ch, nil // want may be the node name of a peer still connecting
		}
	}
	r.stats.refusals[refuseUnknown].Add(1)
	return none, nil, status.Errorf(wire.CodeUnknownPeer, "route %q has no peer %q (peers: %s)", r.name, want, r.listLocked())
}

// use notes that a submit picked p and returns its session (r.mu held).
func (r *Route[S]) use(p *peer[S]) S {
	p.lastUse.Store(time.Now().UnixNano())
	return p.sess
}

// matchLocked finds the active peer want names: by address (as
// configured or as connected), else by node name. Several peers of one
// node name is ambiguous unless exactly one of them is up.
func (r *Route[S]) matchLocked(want string) (*peer[S], error) {
	if want == "" {
		return nil, nil
	}
	var byNode []*peer[S]
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
	live := slices.DeleteFunc(slices.Clone(byNode), func(p *peer[S]) bool { return !p.up() })
	if len(live) == 1 {
		return live[0], nil
	}
	var addrs []string
	for _, p := range byNode {
		addrs = append(addrs, p.addr)
	}
	return nil, status.Errorf(wire.CodeBadRequest, "route %q: %d peers have node name %q (%s); name one by address", r.name, len(byNode), want, strings.Join(addrs, ", "))
}

// listLocked names the active peers for an error: node name, address and
// state, at most 16 of them.
func (r *Route[S]) listLocked() string {
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
func (r *Route[S]) allowed(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	return allowHost(r.Conf().Allow, host)
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
