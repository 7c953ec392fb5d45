package routing

import (
	"context"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/discovery"
)

// dnsWatch is a route's DNS discovery: the watcher of its current dns
// settings and what it last found (guarded by the route's mu).
type dnsWatch struct {
	cancel context.CancelFunc
	addrs  map[string]bool // addresses of the last good answer
	err    error           // the last lookup's error; nil after a good one
}

// watchDNS (re)starts the route's DNS watcher for its current settings;
// with no dns set, peers it found are drained.
func (r *Route[S]) watchDNS() {
	rc := r.Conf()
	r.mu.Lock()
	if r.dns.cancel != nil {
		r.dns.cancel()
		r.dns.cancel = nil
	}
	r.mu.Unlock()
	if rc.DNS == "" {
		r.mu.Lock()
		r.dns.addrs, r.dns.err = nil, nil
		r.drainGoneLocked()
		r.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(r.ctx)
	r.mu.Lock()
	r.dns.cancel = cancel
	r.mu.Unlock()
	res := discovery.Resolver(rc.DNSServer)
	r.t.wg.Add(1)
	go func() {
		defer r.t.wg.Done()
		discovery.Watch(ctx, res, rc.DNS, rc.DNSInterval, func(addrs []string, err error) {
			if ctx.Err() == nil {
				r.dnsUpdate(addrs, err)
			}
		})
	}()
}

// dnsUpdate applies one answer: new addresses become peers, addresses
// gone are drained (unless listed in peers). A failed lookup changes no
// peer: a DNS server that is down must not empty the route.
func (r *Route[S]) dnsUpdate(addrs []string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.stats.dnsErrors.Add(1)
		if r.dns.err == nil {
			r.t.log.Warn("route's DNS lookup failed; keeping its peers", zap.String("route", r.name), zap.String("dns", r.Conf().DNS), zap.Error(err))
		}
		r.dns.err = err
		return
	}
	r.stats.dnsLookups.Add(1)
	r.dns.err = nil
	now := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		now[a] = true
		if !r.dns.addrs[a] {
			r.t.log.Info("peer found in DNS", zap.String("route", r.name), zap.String("addr", a))
		}
		r.addPeerLocked(a, foundDNS)
	}
	r.dns.addrs = now
	r.drainGoneLocked()
}

// drainGoneLocked drains the peers found in DNS that its last answer no
// longer has (r.mu held).
func (r *Route[S]) drainGoneLocked() {
	for _, p := range r.sortedLocked() {
		if p.found == foundDNS && !p.draining && !r.dns.addrs[p.addr] {
			r.drainLocked(p, "gone from DNS")
		}
	}
}

// dnsError is the last DNS lookup's failure, "" if it did not fail.
func (r *Route[S]) dnsError() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dns.err == nil {
		return ""
	}
	return r.dns.err.Error()
}
