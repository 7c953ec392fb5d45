package e2e

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/internal/dnstest"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

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

// TestPeerDNS: a route takes its peers from a DNS name served by a real
// DNS server: both decodes become peers and each push lands where it is
// named; a DNS server that fails changes nothing; one decode killed and
// replaced under the same name with a new address: pushes to it fail
// cleanly while it is gone and land in the new one after, while the other
// decode's session is never touched.
func TestPeerDNS(t *testing.T) {
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
		d := startNode(t, fmt.Sprintf("decode-%d", i), nodeOpts{slots: 8, listen: net.JoinHostPort(ips[i], port)})
		f.decs = append(f.decs, d)
		f.dsts = append(f.dsts, cacheOn(t, d, "kv", 0))
	}
	ns.Set(name, ips[0], ips[1])
	f.pre = startNode(t, "prefill", nodeOpts{slots: 8, extra: routeYAML(nil, fmt.Sprintf(
		"    dns: %s:%s\n    dns_interval: 100ms\n    dns_server: %s\n", name, port, ns.Addr()))})
	f.src = cacheOn(t, f.pre, "src", 0xd45)
	both := func(ps map[string]wire.PeerInfo) bool {
		return len(ps) == 2 && ps[f.decs[0].peers].State == "up" && ps[f.decs[1].peers].State == "up" &&
			ps[f.decs[0].peers].Found == "dns"
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
	up0 := f.decs[0].stats().Sessions

	// decode-1 dies and comes back under the same name at a new address.
	f.decs[1].stop()
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
	d1 := startNode(t, "decode-1", nodeOpts{slots: 8, listen: net.JoinHostPort(ips[2], port)})
	f.decs[1], f.dsts[1] = d1, cacheOn(t, d1, "kv", 0)
	ns.Set(name, ips[0], ips[2])
	waitPeers(t, f.pre, "the new decode-1 found", func(ps map[string]wire.PeerInfo) bool {
		p := ps[d1.peers]
		return len(ps) == 2 && p.State == "up" && p.Node == "decode-1"
	})
	push(1, 16384)
	push(0, 16384)
	if got := f.decs[0].stats().Sessions; got != up0 {
		t.Fatalf("decode-0 has %d sessions, had %d: its session was touched", got, up0)
	}
}
