package routing

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

func TestApply(t *testing.T) {
	h := &fakeHost{}
	tab := testTable(t, h)
	rc := func(name string, stripes int, peers ...string) config.Route {
		return config.Route{Name: name, Stripes: stripes, Peers: peers, ConnectTimeout: time.Second}
	}
	tab.Start(tab.ctx, []config.Route{rc("a", 1, "a:1"), rc("b", 1, "b:1"), rc("c", 1, "c:1")})
	old, _ := tab.Lookup("b")
	kept, _ := tab.Lookup("c")
	added, removed, changed := tab.Apply([]config.Route{rc("b", 2, "b:1"), rc("c", 1, "c:1", "c:2"), rc("d", 1, "d:1")})
	for _, tt := range []struct {
		what      string
		got, want []string
	}{{"added", added, []string{"d"}}, {"removed", removed, []string{"a"}}, {"changed", changed, []string{"b", "c"}}} {
		if !slices.Equal(tt.got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.what, tt.got, tt.want)
		}
	}
	if _, err := tab.Lookup("a"); status.Code(err) != wire.CodeUnknownRoute || !strings.Contains(err.Error(), "have: b, c, d") {
		t.Errorf("Lookup of a removed route: got %v, want unknown route naming b, c, d", err)
	}
	if b, _ := tab.Lookup("b"); b == old || b.Conf().Stripes != 2 || old.ctx.Err() == nil {
		t.Error("a route whose stripes changed was not replaced")
	}
	if c, _ := tab.Lookup("c"); c != kept || !slices.Equal(c.Conf().Peers, []string{"c:1", "c:2"}) {
		t.Error("a route whose peers changed was replaced or not updated")
	}
	kept.mu.Lock()
	n := len(kept.peers)
	kept.mu.Unlock()
	if n != 2 {
		t.Errorf("route c: got %d peers, want 2 (the added one dialed)", n)
	}
}

// TestDNSUpdate: addresses in an answer become peers, addresses gone are
// drained, and a failed lookup changes nothing.
func TestDNSUpdate(t *testing.T) {
	r := testRoute(t, &fakeHost{}, config.Route{Name: "r", Peers: []string{"s:1"}, DNS: "dec:7100"})
	placePeer(r, placed{addr: "s:1"})
	state := func() map[string]string {
		r.mu.Lock()
		defer r.mu.Unlock()
		m := map[string]string{}
		for a, p := range r.peers {
			m[a] = p.found + "/" + p.state()
		}
		return m
	}
	for _, tt := range []struct {
		addrs []string
		err   error
		want  map[string]string
	}{
		{[]string{"d:1", "d:2"}, nil, map[string]string{"s:1": "static/connecting", "d:1": "dns/connecting", "d:2": "dns/connecting"}},
		{nil, status.Errorf(wire.CodeInternal, "SERVFAIL"), map[string]string{"s:1": "static/connecting", "d:1": "dns/connecting", "d:2": "dns/connecting"}},
		{[]string{"d:2", "s:1"}, nil, map[string]string{"s:1": "static/connecting", "d:1": "dns/draining", "d:2": "dns/connecting"}},
	} {
		r.dnsUpdate(tt.addrs, tt.err)
		got := state()
		for a, w := range tt.want {
			// A drained peer may already be gone: it carried nothing.
			if g, ok := got[a]; g != w && !(!ok && strings.HasSuffix(w, "draining")) {
				t.Errorf("after answer %v (%v): peer %s is %q, want %q", tt.addrs, tt.err, a, g, w)
			}
		}
	}
	if r.dnsError() != "" || r.stats.dnsErrors.Load() != 1 || r.stats.dnsLookups.Load() != 2 {
		t.Errorf("dns: error %q, %d errors, %d lookups; want none, 1, 2", r.dnsError(), r.stats.dnsErrors.Load(), r.stats.dnsLookups.Load())
	}
}

// TestCloseIdle: only dynamic peers unused for idle_timeout with nothing
// in flight are drained.
func TestCloseIdle(t *testing.T) {
	busy := newSession("busy", "b:1")
	h := &fakeHost{busy: map[*fakeSession]int{busy: 1}}
	r := testRoute(t, h, config.Route{})
	old := time.Now().Add(-time.Hour)
	for _, pl := range []placed{{addr: "idle:1", found: foundDynamic}, {addr: "busy:1", found: foundDynamic, sess: busy},
		{addr: "static:1"}, {addr: "fresh:1", found: foundDynamic}} {
		p := placePeer(r, pl)
		if pl.addr != "fresh:1" {
			p.lastUse.Store(old.UnixNano())
		}
	}
	r.closeIdle(time.Now(), time.Minute)
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, want := range map[string]bool{"idle:1": true, "busy:1": false, "static:1": false, "fresh:1": false} {
		if p := r.peers[addr]; p != nil && p.draining != want {
			t.Errorf("%s draining: got %v, want %v", addr, p.draining, want)
		}
	}
	if got := r.stats.drained.Load(); got != 1 {
		t.Errorf("drained: got %d, want 1", got)
	}
}

func TestCollector(t *testing.T) {
	tab := testTable(t, &fakeHost{})
	tab.Start(tab.ctx, []config.Route{{Name: "r", Peers: []string{"a:1", "b:1"}, Stripes: 1, ConnectTimeout: time.Second}})
	reg := prometheus.NewRegistry()
	reg.MustRegister(tab.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]float64{}
	n := 0
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			n++
			name := f.GetName()
			for _, l := range m.GetLabel() {
				name += "," + l.GetName() + "=" + l.GetValue()
			}
			series[name] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	// Per route: 3 found x 4 states, 5 refusal reasons, 2 changes, 2 DNS results.
	if n != 12+5+2+2 {
		t.Errorf("series: got %d, want %d", n, 12+5+2+2)
	}
	for name, want := range map[string]float64{
		"stage_route_peer_changes_total,change=added,route=r":     2,
		"stage_route_peers,found=static,route=r,state=connecting": 2,
		"stage_route_refused_total,reason=peer_down,route=r":      0,
		"stage_route_dns_lookups_total,result=error,route=r":      0,
	} {
		if got, ok := series[name]; !ok || got != want {
			t.Errorf("%s: got %v (present %v), want %v", name, got, ok, want)
		}
	}
}

// TestInfo: stagectl routes shows each peer's state, and for a peer with a
// session what is in flight on it and what the sidecar fills in.
func TestInfo(t *testing.T) {
	up := newSession("dec-a", "10.0.0.1:7100")
	h := &fakeHost{busy: map[*fakeSession]int{up: 3}}
	r := testRoute(t, h, config.Route{Name: "r", Transport: "tcp", Stripes: 2})
	placePeer(r, placed{addr: "a:1", node: "dec-a", sess: up})
	placePeer(r, placed{addr: "b:1", down: true})
	var filled []*fakeSession
	ri := r.Info(func(ss *fakeSession, pi *wire.PeerInfo) {
		filled = append(filled, ss)
		pi.Stripes = 2
	})
	if ri.Name != "r" || ri.Transport != "tcp" || ri.Stripes != 2 || len(ri.Peers) != 2 {
		t.Fatalf("route info: got %+v", ri)
	}
	a, b := ri.Peers[0], ri.Peers[1]
	if a.Addr != "a:1" || a.State != "up" || a.Sessions != 1 || a.InFlight != 3 || a.Stripes != 2 {
		t.Errorf("peer a: got %+v, want up, 1 session, 3 in flight, 2 stripes", a)
	}
	if b.Addr != "b:1" || b.State != "down" || b.Sessions != 0 || b.Error != "connection refused" {
		t.Errorf("peer b: got %+v, want down with its dial error", b)
	}
	if len(filled) != 1 || filled[0] != up {
		t.Errorf("fill called for %v, want only the session of a:1", filled)
	}
}
