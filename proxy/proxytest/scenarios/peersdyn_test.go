package scenarios_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/internal/dnstest"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// TestPeerAllow: a route without peers but with an allow list dials a
// named decode on demand, closes its session when idle and dials it again
// when named again; an address outside the list is refused and never
// connected to.
func TestPeerAllow(t *testing.T) {
	f := newFleet(t, 0, func(r *config.Route) {
		r.Allow, r.IdleTimeout = []string{"127.0.0.1/32", ".example.invalid"}, 300*time.Millisecond
	})
	f.decs, _ = startDecodes(t, 2, peerOpts())
	for _, d := range f.decs {
		f.dsts = append(f.dsts, cacheOn(t, d, "kv", 0))
	}
	// Loopback 127.0.0.2 is outside an allow list of 127.0.0.1/32.
	outside, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.2: %v", err)
	}
	outside.Close()
	ln, accepts := countingListener(t, "127.0.0.2:0")
	for _, bad := range []string{ln.Addr().String(), "decode-0.elsewhere.invalid:7100"} {
		if _, err := f.push4k(bad, 0); client.CodeOf(err) != wire.CodeAccessDenied {
			t.Fatalf("naming %s outside the allow list: got %v, want access denied", bad, err)
		}
	}
	for round := 0; round < 2; round++ {
		for i, d := range f.decs {
			if _, err := f.push4k(d.PeerAddr(), uint64(i*8192)); err != nil {
				t.Fatalf("round %d: push to %s dialed on demand: %v", round, d.Name, err)
			}
			if err := kvsim.Verify(f.src, f.dsts[i], []kvsim.Move{{Layer: 0, SrcOff: uint64(i * 8192), DstOff: uint64(i * 8192), Len: 4096}}, guard); err != nil {
				t.Fatal(err)
			}
		}
		ps := peersOf(t, f.pre)
		for _, d := range f.decs {
			if p := ps[d.PeerAddr()]; p.Found != "dynamic" || p.Node != d.Name {
				t.Fatalf("round %d: peer %s: %+v, want dynamic %s", round, d.PeerAddr(), p, d.Name)
			}
		}
		// Idle for 300ms: both sessions close and the peers go.
		waitPeers(t, f.pre, "idle dynamic peers", func(ps map[string]wire.PeerInfo) bool { return len(ps) == 0 })
		if st := f.pre.Snapshot(); st.Sessions != 0 {
			t.Fatalf("round %d: %d sessions after idle_timeout, want 0", round, st.Sessions)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if n := accepts.Load(); n != 0 {
		t.Fatalf("the address outside the allow list got %d connections, want 0", n)
	}
}

// reload gives sc routes as staged's reload does (on a changed file or
// SIGHUP): a config like sc's with these routes, validated, applied.
func reload(t *testing.T, sc *proxytest.Sidecar, routes ...config.Route) {
	t.Helper()
	c := *sc.Config
	c.Routes = routes
	if err := config.Validate(&c); err != nil {
		t.Fatal(err)
	}
	sc.ApplyRoutes(&c)
}

// TestPeerReloadDrains: a reload that removes a peer while a transfer to
// it runs lets the transfer finish, then closes the session; a transfer to
// the peer that stays is not touched; naming the removed one then fails.
func TestPeerReloadDrains(t *testing.T) {
	proxytest.NoLeaks(t)
	// Slow copies on the decodes keep the transfers in flight across the reload.
	slow := peerOpts()
	slow.Configure = slowDevice(0.0002)
	decs, addrs := startDecodes(t, 2, slow)
	pre := proxytest.Start(t, "prefill", "", withRoute(peerOpts(), "prefill", fleetRoute(addrs, nil)))
	if err := pre.WaitSessions(2, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	src := cacheOn(t, pre, "src", 9)
	dsts := []*kvsim.Cache{cacheOn(t, decs[0], "kv", 0), cacheOn(t, decs[1], "kv", 0)}
	ms := []kvsim.Move{{Layer: 1, Len: 256 << 10}} // about 1.3 s of copying at 200 kB/s
	ids := make([]uint64, 2)
	for i := range decs {
		tr := kvsim.Transfer(route, wire.Push, "slow", src, dsts[i], ms)
		tr.Peer = decs[i].Name
		id, err := pre.Client.Submit(context.Background(), tr)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	reload(t, pre, fleetRoute(addrs[:1], nil))
	waitPeers(t, pre, "decode-1 draining with its push in flight", func(ps map[string]wire.PeerInfo) bool {
		p := ps[addrs[1]]
		return p.State == "draining" && p.InFlight == 1 && ps[addrs[0]].State == "up"
	})
	for i, id := range ids {
		st, err := pre.Client.Wait(context.Background(), id, 30*time.Second)
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
	tr := kvsim.Transfer(route, wire.Push, "after", src, dsts[1], ms)
	tr.Peer = "decode-1"
	if _, err := pre.Client.Do(context.Background(), tr); client.CodeOf(err) != wire.CodeUnknownPeer {
		t.Fatalf("naming the removed peer: got %v, want unknown peer", err)
	}
	tr.Peer = ""
	if _, err := pre.Client.Do(context.Background(), tr); err != nil {
		t.Fatalf("naming none on the route of one peer left: %v", err)
	}
}

// sharedPort finds a TCP port free on every one of ips (decodes behind one
// DNS name listen on one port, each on its own address).
func sharedPort(t *testing.T, ips ...string) string {
	t.Helper()
	for try := 0; try < 20; try++ {
		ln, err := net.Listen("tcp", ips[0]+":0")
		if err != nil {
			t.Skipf("cannot listen on %s: %v", ips[0], err)
		}
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		ok := true
		for _, ip := range ips[1:] {
			l2, err := net.Listen("tcp", net.JoinHostPort(ip, port))
			if err != nil {
				ok = false
				break
			}
			l2.Close()
		}
		ln.Close()
		if ok {
			return port
		}
	}
	t.Fatal("no port free on all of", ips)
	return ""
}

// listenOn is peerOpts with the peer port at addr.
func listenOn(addr string) proxytest.Options {
	o := peerOpts()
	o.Configure = func(_ string, c *config.Config) { c.Listen = addr }
	return o
}

// TestPeerDNS: a route takes its peers from a DNS name served by a real
// DNS server: both decodes become peers and each push lands where it is
// named; a DNS server that fails changes nothing; one decode stopped and
// replaced under the same name with a new address: pushes to it fail
// cleanly while it is gone and land in the new one after, while the other
// decode's session is never touched.
func TestPeerDNS(t *testing.T) {
	proxytest.NoLeaks(t)
	ips := []string{"127.0.0.11", "127.0.0.12", "127.0.0.13"}
	port := sharedPort(t, ips...)
	ns, err := dnstest.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Close)
	const name = "decode.stage.test"
	f := &fleet{}
	for i := 0; i < 2; i++ {
		d := proxytest.Start(t, fmt.Sprintf("decode-%d", i), "", listenOn(net.JoinHostPort(ips[i], port)))
		f.decs = append(f.decs, d)
		f.dsts = append(f.dsts, cacheOn(t, d, "kv", 0))
	}
	ns.Set(name, ips[0], ips[1])
	f.pre = proxytest.Start(t, "prefill", "", withRoute(peerOpts(), "prefill", fleetRoute(nil, func(r *config.Route) {
		r.DNS, r.DNSInterval, r.DNSServer = name+":"+port, 100*time.Millisecond, ns.Addr()
	})))
	f.src = cacheOn(t, f.pre, "src", 0xd45)
	both := func(ps map[string]wire.PeerInfo) bool {
		return len(ps) == 2 && ps[f.decs[0].PeerAddr()].State == "up" && ps[f.decs[1].PeerAddr()].State == "up" &&
			ps[f.decs[0].PeerAddr()].Found == "dns"
	}
	waitPeers(t, f.pre, "both decodes found in DNS", both)
	push := func(to int, off uint64) {
		t.Helper()
		if _, err := f.push4k(fmt.Sprintf("decode-%d", to), off); err != nil {
			t.Fatalf("push to decode-%d: %v", to, err)
		}
		if err := kvsim.Verify(f.src, f.dsts[to], []kvsim.Move{{Layer: 0, SrcOff: off, DstOff: off, Len: 4096}}, guard); err != nil {
			t.Fatal(err)
		}
	}
	push(0, 0)
	push(1, 8192)

	ns.Fail(true)
	time.Sleep(400 * time.Millisecond)
	if ps := peersOf(t, f.pre); !both(ps) {
		t.Fatalf("peers changed while the DNS server failed: %+v", ps)
	}
	ns.Fail(false)
	up0 := f.decs[0].Snapshot().Sessions

	// decode-1 goes and comes back under the same name at a new address.
	if err := f.decs[1].Close(); err != nil {
		t.Fatal(err)
	}
	ns.Set(name, ips[0])
	waitPeers(t, f.pre, "decode-1 gone", func(ps map[string]wire.PeerInfo) bool { return len(ps) == 1 })
	start := time.Now()
	_, err = f.push4k("decode-1", 0)
	if c := client.CodeOf(err); c != wire.CodeUnknownPeer && c != wire.CodePeerUnavailable {
		t.Fatalf("push to decode-1 while it is gone: got %v, want unknown peer or peer unavailable", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("push to decode-1 while it is gone took %v to fail", d)
	}
	d1 := proxytest.Start(t, "decode-1", "", listenOn(net.JoinHostPort(ips[2], port)))
	f.decs[1], f.dsts[1] = d1, cacheOn(t, d1, "kv", 0)
	ns.Set(name, ips[0], ips[2])
	waitPeers(t, f.pre, "the new decode-1 found", func(ps map[string]wire.PeerInfo) bool {
		p := ps[d1.PeerAddr()]
		return len(ps) == 2 && p.State == "up" && p.Node == "decode-1"
	})
	push(1, 16384)
	push(0, 16384)
	if got := f.decs[0].Snapshot().Sessions; got != up0 {
		t.Fatalf("decode-0 has %d sessions, had %d: its session was touched", got, up0)
	}
}
