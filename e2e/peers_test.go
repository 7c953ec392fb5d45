package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// fleet is a prefill whose route "decode" reaches several decodes, each
// with a cache of one name ("kv"), as identical decode pods have.
type fleet struct {
	pre  *node
	decs []*node
	src  *kvsim.Cache
	dsts []*kvsim.Cache
}

// routeYAML is a route named decode with these peers and extra keys.
func routeYAML(peers []string, extra string) string {
	q := make([]string, len(peers))
	for i, p := range peers {
		q[i] = fmt.Sprintf("%q", p)
	}
	return fmt.Sprintf("routes:\n  - name: decode\n    peers: [%s]\n    stripes: 1\n    connect_timeout: 2s\n    progress_timeout: 10s\n%s",
		strings.Join(q, ", "), extra)
}

// newFleet starts n decodes (decode-0 ...) and a prefill with one route to
// all of them (routeExtra: more keys of the route), each side with caches.
func newFleet(t *testing.T, n int, routeExtra string) *fleet {
	t.Helper()
	f := &fleet{}
	var addrs []string
	for i := 0; i < n; i++ {
		d := startNode(t, fmt.Sprintf("decode-%d", i), nodeOpts{slots: 8})
		f.decs = append(f.decs, d)
		addrs = append(addrs, d.peers)
	}
	f.pre = startNode(t, "prefill", nodeOpts{slots: 8, extra: routeYAML(addrs, routeExtra) + "metrics:\n  listen: 127.0.0.1:0\n"})
	f.pre.settle(n)
	f.src = cacheOn(t, f.pre, "src", 0x5eed)
	for _, d := range f.decs {
		f.dsts = append(f.dsts, cacheOn(t, d, "kv", 0))
	}
	return f
}

// cacheOn registers a 2-layer cache of 256 KiB layers named name on n:
// filled from seed, or poisoned with guard when seed is 0.
func cacheOn(t *testing.T, n *node, name string, seed uint64) *kvsim.Cache {
	t.Helper()
	c, err := kvsim.New(name, 2, 256<<10, 12288)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if seed != 0 {
		err = c.Fill(seed)
	} else {
		err = c.Poison(guard)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Register(context.Background(), n.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	cl := n.cl // a node stopped by the test has none left
	t.Cleanup(func() { _ = c.Unregister(context.Background(), cl) })
	return c
}

// untouched fails unless every byte of c still holds the guard.
func untouched(t *testing.T, what string, c *kvsim.Cache) {
	t.Helper()
	all, err := c.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(all, bytes.Repeat([]byte{guard}, len(all))) {
		t.Fatalf("%s changed", what)
	}
}

// push4k pushes 4 KiB at off of layer 0 into the fleet's decode cache,
// to peer (empty: naming none).
func (f *fleet) push4k(peer string, off uint64) (client.Transfer, error) {
	tr := kvsim.Transfer("decode", wire.Push, fmt.Sprintf("to-%s-%d", peer, off), f.src, f.dsts[0],
		[]kvsim.Move{{Layer: 0, SrcOff: off, DstOff: off, Len: 4096}})
	tr.Peer = peer
	_, err := f.pre.cl.Do(context.Background(), tr)
	return tr, err
}

// TestPeerNamed: on a route of two decodes with caches of one name, each
// push lands in the decode it names (by node name or address) and nowhere
// else; a push naming none, an unknown node or an address outside the
// route is refused, and nothing moves.
func TestPeerNamed(t *testing.T) {
	f := newFleet(t, 2, "")
	moves := func(off uint64) []kvsim.Move { return []kvsim.Move{{Layer: 0, SrcOff: off, DstOff: off, Len: 4096}} }

	_, err := f.push4k("", 0)
	if client.CodeOf(err) != wire.CodeBadRequest || !strings.Contains(err.Error(), "decode-0 at "+f.decs[0].peers) ||
		!strings.Contains(err.Error(), "decode-1 at "+f.decs[1].peers) {
		t.Fatalf("naming no peer: got %v, want bad request listing both peers", err)
	}
	_, err = f.push4k("decode-9", 0)
	if client.CodeOf(err) != wire.CodeUnknownPeer || !strings.Contains(err.Error(), `has no peer "decode-9"`) {
		t.Fatalf("naming an unknown node: got %v, want unknown peer", err)
	}
	ln, accepts := countingListener(t)
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
	if _, err := f.push4k(f.decs[0].peers, 4096); err != nil {
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
		p := ps[d.peers]
		if p.Node != d.name || p.Found != "static" || p.State != "up" || p.Sessions != 1 || p.StreamsUp != 1 || p.InFlight != 0 {
			t.Errorf("stagectl routes shows %s as %+v", d.name, p)
		}
	}
	_, body := scrape(t, f.pre.metrics, "/metrics")
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

// countingListener listens on loopback and counts the connections it accepts.
func countingListener(t *testing.T) (net.Listener, *atomic.Int64) {
	t.Helper()
	return countingListenerOn(t, "127.0.0.1:0")
}

// countingListenerOn is countingListener on addr.
func countingListenerOn(t *testing.T, addr string) (net.Listener, *atomic.Int64) {
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
	f := newFleet(t, 2, "    pick: any\n")
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
	var decs []*node
	var addrs []string
	for i := 0; i < 2; i++ {
		d := startNode(t, fmt.Sprintf("decode-%d", i), nodeOpts{slots: 8})
		decs, addrs = append(decs, d), append(addrs, d.peers)
	}
	pre := startNode(t, "prefill", nodeOpts{slots: 8, extra: routeYAML(addrs, "")})
	pre.settle(2)
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
	sub := m.Submit("decode", "none", wire.Push, src, dst1)
	if _, err := pre.cl.SubmitKV(context.Background(), sub); client.CodeOf(err) != wire.CodeBadRequest {
		t.Fatalf("KV push naming no peer: got %v, want bad request", err)
	}
	sub.Peer, sub.Tag = "decode-1", "named"
	doKV(t, pre.cl, []wire.SubmitKV{sub})
	if err := kvsim.Expect(src, dst1, want1, m); err != nil {
		t.Fatal(err)
	}
	after0, err := dst0.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "decode-0's cache", after0, before0)
}
