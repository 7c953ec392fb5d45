package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/e2e/e2etest"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

const guard = 0xAB

// caches makes a source cache on one node and a destination cache on the
// other, each layer a region at a non-zero offset inside one allocation.
func caches(t *testing.T, src, dst *node, layers int, layerBytes uint64) (S, D *kvsim.Cache) {
	t.Helper()
	ctx := context.Background()
	var err error
	S, err = kvsim.New(src.name+"-kv", layers, layerBytes, 12288)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { S.Close() })
	D, err = kvsim.New(dst.name+"-kv", layers, layerBytes, 12288)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { D.Close() })
	if err := S.Fill(uint64(time.Now().UnixNano())); err != nil {
		t.Fatal(err)
	}
	if err := D.Poison(guard); err != nil {
		t.Fatal(err)
	}
	if err := S.Register(ctx, src.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	if err := D.Register(ctx, dst.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = S.Unregister(context.Background(), src.cl)
		_ = D.Unregister(context.Background(), dst.cl)
	})
	return S, D
}

// scrape GETs path from a sidecar's metrics listener at addr.
func scrape(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	code, body, err := e2etest.Scrape("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	return code, body
}

// metricValue finds one sample ("name{labels} value") in an exposition.
func metricValue(body, series string) (float64, bool) { return e2etest.MetricValue(body, series) }

// routeYAML is a route named decode with these peers and extra keys.
func routeYAML(peers []string, extra string) string {
	q := make([]string, len(peers))
	for i, p := range peers {
		q[i] = fmt.Sprintf("%q", p)
	}
	return fmt.Sprintf("routes:\n  - name: decode\n    peers: [%s]\n    stripes: 1\n    connect_timeout: 2s\n    progress_timeout: 10s\n%s",
		strings.Join(q, ", "), extra)
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
