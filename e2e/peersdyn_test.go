package e2e

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// peersOf is route decode's peers on n, by address.
func peersOf(t *testing.T, n *node) map[string]wire.PeerInfo {
	t.Helper()
	rs, err := n.cl.Routes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]wire.PeerInfo{}
	for _, r := range rs {
		if r.Name == "decode" {
			for _, p := range r.Peers {
				m[p.Addr] = p
			}
		}
	}
	return m
}

// waitPeers waits until ok holds of route decode's peers on n.
func waitPeers(t *testing.T, n *node, what string, ok func(map[string]wire.PeerInfo) bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ps := peersOf(t, n)
		if ok(ps) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: peers %+v\n%s", what, ps, n.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// baseConfig is n's config without its routes.
func baseConfig(n *node) string {
	base, _, _ := strings.Cut(n.configText, "routes:")
	return base
}

// TestPeerAllow: a route without peers but with an allow list dials a
// named decode on demand, closes its session when idle and dials it again
// when named again; an address outside the list is refused and never
// connected to.
func TestPeerAllow(t *testing.T) {
	f := newFleet(t, 0, "    allow: [\"127.0.0.1/32\", \".example.invalid\"]\n    idle_timeout: 300ms\n")
	for i := 0; i < 2; i++ {
		d := startNode(t, "decode-"+string(rune('0'+i)), nodeOpts{slots: 8})
		f.decs = append(f.decs, d)
		f.dsts = append(f.dsts, cacheOn(t, d, "kv", 0))
	}
	// Loopback 127.0.0.2 is outside an allow list of 127.0.0.1/32.
	outside, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.2: %v", err)
	}
	outside.Close()
	ln, accepts := countingListenerOn(t, "127.0.0.2:0")
	for _, bad := range []string{ln.Addr().String(), "decode-0.elsewhere.invalid:7100"} {
		if _, err := f.push4k(bad, 0); client.CodeOf(err) != wire.CodeAccessDenied {
			t.Fatalf("naming %s outside the allow list: got %v, want access denied", bad, err)
		}
	}
	for round := 0; round < 2; round++ {
		for i, d := range f.decs {
			if _, err := f.push4k(d.peers, uint64(i*8192)); err != nil {
				t.Fatalf("round %d: push to %s dialed on demand: %v", round, d.name, err)
			}
			if err := kvsim.Verify(f.src, f.dsts[i], []kvsim.Move{{Layer: 0, SrcOff: uint64(i * 8192), DstOff: uint64(i * 8192), Len: 4096}}, guard); err != nil {
				t.Fatal(err)
			}
		}
		ps := peersOf(t, f.pre)
		for _, d := range f.decs {
			if p := ps[d.peers]; p.Found != "dynamic" || p.Node != d.name {
				t.Fatalf("round %d: peer %s: %+v, want dynamic %s", round, d.peers, p, d.name)
			}
		}
		// Idle for 300ms: both sessions close and the peers go.
		waitPeers(t, f.pre, "idle dynamic peers", func(ps map[string]wire.PeerInfo) bool { return len(ps) == 0 })
		if st := f.pre.stats(); st.Sessions != 0 {
			t.Fatalf("round %d: %d sessions after idle_timeout, want 0", round, st.Sessions)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if n := accepts.Load(); n != 0 {
		t.Fatalf("the address outside the allow list got %d connections, want 0", n)
	}
}

// TestPeerReloadDrains: a reload that removes a peer while a transfer to
// it runs lets the transfer finish, then closes the session; a transfer to
// the peer that stays is not touched; naming the removed one then fails.
func TestPeerReloadDrains(t *testing.T) {
	var decs []*node
	var addrs []string
	for i := 0; i < 2; i++ {
		// Slow copies on the decodes keep the transfers in flight across the reload.
		d := startNode(t, "decode-"+string(rune('0'+i)), nodeOpts{slots: 8, extra: "device:\n  hostmem:\n    bandwidth_gbps: 0.0002\n"})
		decs, addrs = append(decs, d), append(addrs, d.peers)
	}
	pre := startNode(t, "prefill", nodeOpts{slots: 8, extra: routeYAML(addrs, "")})
	pre.settle(2)
	src := cacheOn(t, pre, "src", 9)
	dsts := []*kvsim.Cache{cacheOn(t, decs[0], "kv", 0), cacheOn(t, decs[1], "kv", 0)}
	ms := []kvsim.Move{{Layer: 1, Len: 256 << 10}} // about 1.3 s of copying at 200 kB/s
	ids := make([]uint64, 2)
	for i := range decs {
		tr := kvsim.Transfer("decode", wire.Push, "slow", src, dsts[i], ms)
		tr.Peer = decs[i].name
		id, err := pre.cl.Submit(context.Background(), tr)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	rewrite(t, pre, baseConfig(pre)+routeYAML(addrs[:1], ""))
	waitPeers(t, pre, "decode-1 draining with its push in flight", func(ps map[string]wire.PeerInfo) bool {
		p := ps[addrs[1]]
		return p.State == "draining" && p.InFlight == 1 && ps[addrs[0]].State == "up"
	})
	for i, id := range ids {
		st, err := pre.cl.Wait(context.Background(), id, 30*time.Second)
		if err != nil || st.State != wire.StateDone {
			t.Fatalf("push to decode-%d across the reload: %+v, %v", i, st, err)
		}
		if err := kvsim.Verify(src, dsts[i], ms, guard); err != nil {
			t.Fatal(err)
		}
	}
	waitPeers(t, pre, "decode-1 gone", func(ps map[string]wire.PeerInfo) bool {
		_, gone := ps[addrs[1]]
		return !gone && len(ps) == 1 && ps[addrs[0]].State == "up"
	})
	tr := kvsim.Transfer("decode", wire.Push, "after", src, dsts[1], ms)
	tr.Peer = "decode-1"
	if _, err := pre.cl.Do(context.Background(), tr); client.CodeOf(err) != wire.CodeUnknownPeer {
		t.Fatalf("naming the removed peer: got %v, want unknown peer", err)
	}
	tr.Peer = ""
	if _, err := pre.cl.Do(context.Background(), tr); err != nil {
		t.Fatalf("naming none on the route of one peer left: %v", err)
	}
}
