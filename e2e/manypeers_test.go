package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// smallPeer is the environment of sidecars many of which run on one
// machine: no splice send, so no start-up probe.
var smallPeer = []string{"STAGE_STAGING_SPLICE_SEND=false"}

// TestManyPeers: one sidecar with a route to 64 decodes on loopback
// (hostmem): all sessions up, a push named to each lands in it and only
// it, and the sidecar's resident memory per peer session is reported
// (docs/BENCHMARKS.md, "Many peers"). Under the race detector 16 decodes
// (each race-built process costs several times the memory).
func TestManyPeers(t *testing.T) {
	n := 64
	if raceBuild {
		n = 16
	}
	if testing.Short() {
		t.Skip("starts 65 sidecars")
	}
	var decs []*node
	var addrs []string
	for i := 0; i < n; i++ {
		d := startNode(t, fmt.Sprintf("decode-%02d", i), nodeOpts{slots: 4, slot: "64KiB", env: smallPeer})
		decs, addrs = append(decs, d), append(addrs, d.peers)
	}
	// The limits need a restart, the route does not: start without the
	// route, measure, then add it by reload.
	hub := startNode(t, "prefill", nodeOpts{slots: 64, slot: "256KiB", env: smallPeer, extra: "limits:\n  max_sessions: 80\n  max_streams: 100\n"})
	time.Sleep(300 * time.Millisecond)
	before := hub.stats()
	rewrite(t, hub, hub.configText+routeYAML(addrs, ""))
	waitPeers(t, hub, fmt.Sprintf("%d sessions up", n), func(ps map[string]wire.PeerInfo) bool {
		up := 0
		for _, p := range ps {
			if p.State == "up" && p.Sessions == 1 && p.StreamsUp == 1 {
				up++
			}
		}
		return up == n
	})
	time.Sleep(300 * time.Millisecond)
	up := hub.stats()
	src := cacheOn(t, hub, "src", 0x64)
	dsts := make([]*kvsim.Cache, n)
	for i, d := range decs {
		dsts[i] = cacheOn(t, d, "kv", 0)
	}
	for i, d := range decs {
		off := uint64(i%32) * 8192
		tr := kvsim.Transfer("decode", wire.Push, d.name, src, dsts[i], []kvsim.Move{{Layer: i % 2, SrcOff: off, DstOff: off, Len: 4096}})
		tr.Peer = d.name
		if _, err := hub.cl.Do(context.Background(), tr); err != nil {
			t.Fatalf("push to %s: %v", d.name, err)
		}
	}
	for i := range decs {
		off := uint64(i%32) * 8192
		if err := kvsim.Verify(src, dsts[i], []kvsim.Move{{Layer: i % 2, SrcOff: off, DstOff: off, Len: 4096}}, guard); err != nil {
			t.Fatalf("decode-%02d: %v", i, err)
		}
	}
	after := hub.stats()
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(n) / 1024 }
	msg := fmt.Sprintf("%d peer sessions (1 stripe each, race build %v): RSS %.1f MiB idle, %.1f MiB with sessions up (%.0f KiB per session), %.1f MiB after a push to each (%.0f KiB per session); goroutines %d -> %d, fds %d -> %d",
		n, raceBuild, float64(before.RSSBytes)/(1<<20), float64(up.RSSBytes)/(1<<20), per(up.RSSBytes, before.RSSBytes),
		float64(after.RSSBytes)/(1<<20), per(after.RSSBytes, before.RSSBytes), before.Goroutines, up.Goroutines, before.FDs, up.FDs)
	t.Log(msg)
	if p := os.Getenv("STAGE_MANY_PEERS_REPORT"); p != "" {
		_ = os.WriteFile(p, []byte(msg+"\n"), 0o644)
	}
}
