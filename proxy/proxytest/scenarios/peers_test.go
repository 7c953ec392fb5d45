package scenarios_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// fleet is a prefill whose route "decode" reaches several decodes, each
// with a cache of one name ("kv"), as identical decode pods have.
type fleet struct {
	pre  *proxytest.Sidecar
	decs []*proxytest.Sidecar
	src  *kvsim.Cache
	dsts []*kvsim.Cache
}

// peerOpts are the sidecars of the peer scenarios: 8 slots of 1 MiB.
func peerOpts() proxytest.Options {
	o := e2eOpts()
	o.Slots = 8
	return o
}

// fleetRoute is route "decode" to peers with one data stream each,
// edited by edit when set.
func fleetRoute(peers []string, edit func(*config.Route)) config.Route {
	r := proxytest.Options{Stripes: 1}.RouteTo(peers...)
	if edit != nil {
		edit(&r)
	}
	return r
}

// withRoute is o, with r the one route of the sidecar called name.
func withRoute(o proxytest.Options, name string, r config.Route) proxytest.Options {
	prev := o.Configure
	o.Configure = func(n string, c *config.Config) {
		if prev != nil {
			prev(n, c)
		}
		if n == name {
			c.Routes = []config.Route{r}
		}
	}
	return o
}

// startDecodes starts decode-0 ... decode-(n-1) with o, and returns them
// and their peer addresses.
func startDecodes(t *testing.T, n int, o proxytest.Options) ([]*proxytest.Sidecar, []string) {
	t.Helper()
	var decs []*proxytest.Sidecar
	var addrs []string
	for i := range n {
		d := proxytest.Start(t, fmt.Sprintf("decode-%d", i), "", o)
		decs, addrs = append(decs, d), append(addrs, d.PeerAddr())
	}
	return decs, addrs
}

// newFleet starts n decodes and a prefill, serving metrics, with one
// route to all of them (edited by edit), each side with caches.
func newFleet(t *testing.T, n int, edit func(*config.Route)) *fleet {
	t.Helper()
	proxytest.NoLeaks(t)
	f := &fleet{}
	var addrs []string
	f.decs, addrs = startDecodes(t, n, peerOpts())
	o := peerOpts()
	o.Metrics = true
	f.pre = proxytest.Start(t, "prefill", "", withRoute(o, "prefill", fleetRoute(addrs, edit)))
	if err := f.pre.WaitSessions(n, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	f.src = cacheOn(t, f.pre, "src", 0x5eed)
	for _, d := range f.decs {
		f.dsts = append(f.dsts, cacheOn(t, d, "kv", 0))
	}
	return f
}

// push4k pushes 4 KiB at off of layer 0 into the fleet's decode cache,
// to peer (empty: naming none).
func (f *fleet) push4k(peer string, off uint64) (client.Transfer, error) {
	tr := kvsim.Transfer(route, wire.Push, fmt.Sprintf("to-%s-%d", peer, off), f.src, f.dsts[0],
		[]kvsim.Move{{Layer: 0, SrcOff: off, DstOff: off, Len: 4096}})
	tr.Peer = peer
	_, err := f.pre.Client.Do(context.Background(), tr)
	return tr, err
}

// peersOf is route decode's peers on sc, by address.
func peersOf(t *testing.T, sc *proxytest.Sidecar) map[string]wire.PeerInfo {
	t.Helper()
	rs, err := sc.Client.Routes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]wire.PeerInfo{}
	for _, r := range rs {
		if r.Name == route {
			for _, p := range r.Peers {
				m[p.Addr] = p
			}
		}
	}
	return m
}

// waitPeers waits until ok holds of route decode's peers on sc.
func waitPeers(t *testing.T, sc *proxytest.Sidecar, what string, ok func(map[string]wire.PeerInfo) bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ps := peersOf(t, sc)
		if ok(ps) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: peers %+v", what, ps)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPeerNamed: on a route of two decodes with caches of one name, each
// push lands in the decode it names (by node name or address) and nowhere
// else; a push naming none, an unknown node or an address outside the
// route is refused, and nothing moves.
func TestPeerNamed(t *testing.T) {
	f := newFleet(t, 2, nil)
	moves := func(off uint64) []kvsim.Move { return []kvsim.Move{{Layer: 0, SrcOff: off, DstOff: off, Len: 4096}} }

	_, err := f.push4k("", 0)
	if client.CodeOf(err) != wire.CodeBadRequest || !strings.Contains(err.Error(), "decode-0 at "+f.decs[0].PeerAddr()) ||
		!strings.Contains(err.Error(), "decode-1 at "+f.decs[1].PeerAddr()) {
		t.Fatalf("naming no peer: got %v, want bad request listing both peers", err)
	}
	_, err = f.push4k("decode-9", 0)
	if client.CodeOf(err) != wire.CodeUnknownPeer || !strings.Contains(err.Error(), `has no peer "decode-9"`) {
		t.Fatalf("naming an unknown node: got %v, want unknown peer", err)
	}
	ln, accepts := countingListener(t, "127.0.0.1:0")
	_, err = f.push4k(ln.Addr().String(), 0)
	if client.CodeOf(err) != wire.CodeAccessDenied || !strings.Contains(err.Error(), "nothing was dialed") {
		t.Fatalf("naming an address outside the route: got %v, want access denied", err)
	}
	untouched(t, "decode-0's cache after refusals", f.dsts[0])
	untouched(t, "decode-1's cache after refusals", f.dsts[1])

	// The repro: six pushes meant for decode-1.
	for i := uint64(0); i < 6; i++ {
		if _, err := f.push4k("decode-1", i*8192); err != nil {
			t.Fatalf("push %d to decode-1: %v", i, err)
		}
		if err := kvsim.Verify(f.src, f.dsts[1], moves(i*8192), guard); err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
	}
	untouched(t, "decode-0's cache after pushes to decode-1", f.dsts[0])
	if _, err := f.push4k(f.decs[0].PeerAddr(), 4096); err != nil {
		t.Fatalf("push to decode-0 by address: %v", err)
	}
	if err := kvsim.Verify(f.src, f.dsts[0], moves(4096), guard); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if n := accepts.Load(); n != 0 {
		t.Fatalf("the address outside the route was dialed %d times, want 0", n)
	}
	checkRouteView(t, f)
}

// checkRouteView checks what stagectl routes and /metrics show of the
// fleet's route after TestPeerNamed's three refusals.
func checkRouteView(t *testing.T, f *fleet) {
	t.Helper()
	ps := peersOf(t, f.pre)
	for _, d := range f.decs {
		p := ps[d.PeerAddr()]
		if p.Node != d.Name || p.Found != "static" || p.State != "up" || p.Sessions != 1 || p.StreamsUp != 1 || p.InFlight != 0 {
			t.Errorf("stagectl routes shows %s as %+v", d.Name, p)
		}
	}
	_, body := scrape(t, f.pre, "/metrics")
	for series, want := range map[string]float64{
		`stage_route_peers{found="static",route="decode",state="up"}`:      2,
		`stage_route_peers{found="dns",route="decode",state="up"}`:         0,
		`stage_route_refused_total{reason="no_peer_named",route="decode"}`: 1,
		`stage_route_refused_total{reason="unknown_peer",route="decode"}`:  1,
		`stage_route_refused_total{reason="not_allowed",route="decode"}`:   1,
		`stage_route_peer_changes_total{change="added",route="decode"}`:    2,
		`stage_route_dns_lookups_total{result="ok",route="decode"}`:        0,
	} {
		if got, ok := metricValue(body, series); !ok || got != want {
			t.Errorf("%s: got %v (found %v), want %v", series, got, ok, want)
		}
	}
}

// countingListener listens on addr and counts the connections it accepts.
func countingListener(t *testing.T, addr string) (net.Listener, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln, &n
}

// TestPeerPickAny: a route with pick: any takes a push naming no peer.
func TestPeerPickAny(t *testing.T) {
	f := newFleet(t, 2, func(r *config.Route) { r.Pick = config.PickAny })
	for i := 0; i < 4; i++ {
		if _, err := f.push4k("", 0); err != nil {
			t.Fatalf("push %d naming no peer on a pick: any route: %v", i, err)
		}
	}
	for i, d := range f.dsts {
		if err := kvsim.Verify(f.src, d, []kvsim.Move{{Layer: 0, Len: 4096}}, guard); err != nil {
			t.Errorf("decode-%d (round robin reaches both): %v", i, err)
		}
	}
}

// TestPeerNamedKV: a KV push names its decode; the other's cache of the
// same name is untouched, and one naming none on the two-peer route is
// refused.
func TestPeerNamedKV(t *testing.T) {
	proxytest.NoLeaks(t)
	decs, addrs := startDecodes(t, 2, peerOpts())
	pre := proxytest.Start(t, "prefill", "", withRoute(peerOpts(), "prefill", fleetRoute(addrs, nil)))
	if err := pre.WaitSessions(2, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	p := kvlayout.Params{DType: kvlayout.F16, Blocks: 16, BlockSize: 16, Heads: 4, HeadHi: 4, HeadSize: 32}
	src := kvCacheNamed(t, pre, "src", "vllm-flash", p, 2, 7)
	dst0, dst1 := kvCacheNamed(t, decs[0], "kv", "vllm-flash", p, 2, 0), kvCacheNamed(t, decs[1], "kv", "vllm-flash", p, 2, 0)
	before0, err := dst0.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	want1, err := dst1.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	m := kvsim.KVMove{Layers: []int{0, 1}, SrcTable: []uint32{3, 4}, DstTable: []uint32{5, 6}, Tokens: 20}
	sub := m.Submit(route, "none", wire.Push, src, dst1)
	if _, err := pre.Client.SubmitKV(context.Background(), sub); client.CodeOf(err) != wire.CodeBadRequest {
		t.Fatalf("KV push naming no peer: got %v, want bad request", err)
	}
	sub.Peer, sub.Tag = "decode-1", "named"
	doKV(t, pre.Client, []wire.SubmitKV{sub})
	if err := kvsim.Expect(src, dst1, want1, m); err != nil {
		t.Fatal(err)
	}
	after0, err := dst0.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "decode-0's cache", after0, before0)
}

// TestPeerLimits: past limits.max_sessions or limits.max_streams a route
// does not dial, its peer shows why, and a push naming it is refused with
// that reason.
func TestPeerLimits(t *testing.T) {
	for _, tc := range []struct {
		name, want  string
		limits      func(*config.Limits)
		stripes, up int
	}{
		{"sessions", "limits.max_sessions (2) reached", func(l *config.Limits) { l.MaxSessions = 2 }, 1, 2},
		{"streams", "limits.max_streams (5) reached", func(l *config.Limits) { l.MaxStreams = 5 }, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxytest.NoLeaks(t)
			// Many sidecars of one test: no splice send, so no start-up probe.
			small := proxytest.Options{Slots: 4, SlotSize: 64 * config.KiB, Configure: func(name string, c *config.Config) {
				c.Staging.SpliceSend = false
				if name == "prefill" {
					tc.limits(&c.Limits)
				}
			}}
			decs, addrs := startDecodes(t, 3, small)
			small.Slots = 8
			hub := proxytest.Start(t, "prefill", "", withRoute(small, "prefill", fleetRoute(addrs, func(r *config.Route) { r.Stripes = tc.stripes })))
			var refused string
			waitPeers(t, hub, "peers up to the limit, the rest refused", func(ps map[string]wire.PeerInfo) bool {
				up, down := 0, 0
				for a, p := range ps {
					if p.State == "up" {
						up++
					} else if strings.Contains(p.Error, tc.want) {
						down, refused = down+1, a
					}
				}
				return up == tc.up && down == 3-tc.up
			})
			src := cacheOn(t, hub, "src", 3)
			dst := cacheOn(t, decs[0], "kv", 0)
			tr := kvsim.Transfer(route, wire.Push, "over", src, dst, []kvsim.Move{{Len: 4096}})
			tr.Peer = refused // by address: its node name is never learnt
			_, err := hub.Client.Do(context.Background(), tr)
			if client.CodeOf(err) != wire.CodePeerUnavailable || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("push to %s past the limit: got %v, want peer unavailable saying %q", refused, err, tc.want)
			}
		})
	}
}
