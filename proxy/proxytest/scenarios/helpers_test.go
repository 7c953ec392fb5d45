package scenarios_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/e2e/e2etest"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// gnet starts its worker pool's goroutines when its package initialises:
// they are there before any test and stay; every other goroutine must go.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreCurrent()) }

// guard poisons destination memory: a byte still guard was not written.
const guard = 0xAB

// route is the route name every scenario's sender uses.
const route = proxytest.Route

// e2eOpts are the sidecars e2e ran: 16 slots of 1 MiB, 2 data streams.
func e2eOpts() proxytest.Options {
	return proxytest.Options{SlotSize: config.MiB, Slots: 16}
}

// shapes are the moves of the bulk scenarios: whole ranges and scattered
// blocks, pushed and pulled.
var shapes = []struct {
	name  string
	dir   wire.Direction
	moves func(c *kvsim.Cache) []kvsim.Move
}{
	{"push ranges 1MiB", wire.Push, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Ranges(c, 1<<20) }},
	{"push blocks 16KiB", wire.Push, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Blocks(c, 16<<10, 11) }},
	{"pull ranges 1MiB", wire.Pull, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Ranges(c, 1<<20) }},
	{"pull blocks 16KiB", wire.Pull, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Blocks(c, 16<<10, 12) }},
}

// oneNode is e2eOpts for sidecars on one node, transport auto (ipc).
func oneNode(t *testing.T) proxytest.Options {
	o := e2eOpts()
	o.NodeDir, o.Transport = proxytest.NodeDir(t), "auto"
	return o
}

// slowDevice makes the emulated device of the sidecars named (all when
// none is named) copy at gbps, so transfers stay in flight for a while.
func slowDevice(gbps float64, names ...string) func(string, *config.Config) {
	return func(name string, c *config.Config) {
		for _, n := range names {
			if n == name {
				c.Device.Hostmem.BandwidthGBps = gbps
			}
		}
		if len(names) == 0 {
			c.Device.Hostmem.BandwidthGBps = gbps
		}
	}
}

// caches makes a source cache registered with src and a poisoned
// destination cache registered with dst, each layer a region at a
// non-zero offset inside one allocation; the test's cleanups unregister
// and free them.
func caches(t *testing.T, src, dst *proxytest.Sidecar, layers int, layerBytes uint64) (S, D *kvsim.Cache) {
	t.Helper()
	S = newCache(t, src, src.Name+"-kv", layers, layerBytes, uint64(time.Now().UnixNano()))
	D = newCache(t, dst, dst.Name+"-kv", layers, layerBytes, 0)
	return S, D
}

// newCache registers a cache of layers x layerBytes named name with sc,
// all access granted: filled from seed, or poisoned with guard when seed
// is 0. A sidecar the test closes takes its registrations with it.
func newCache(t *testing.T, sc *proxytest.Sidecar, name string, layers int, layerBytes, seed uint64) *kvsim.Cache {
	t.Helper()
	c := registerCache(t, sc.Client, name, layers, layerBytes, seed)
	t.Cleanup(func() { _ = c.Unregister(context.Background(), sc.Client) })
	return c
}

// registerCache registers a cache of layers x layerBytes named name over
// cl, all access granted: filled from seed, or poisoned with guard when
// seed is 0. It is not unregistered: its connection's end (or the
// caller's cleanup) lets it go.
func registerCache(t *testing.T, cl *client.Client, name string, layers int, layerBytes, seed uint64) *kvsim.Cache {
	t.Helper()
	c, err := kvsim.New(name, layers, layerBytes, 12288)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if seed != 0 {
		err = c.Fill(seed)
	} else {
		err = c.Poison(guard)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Register(context.Background(), cl, wire.AccessAll); err != nil {
		t.Fatalf("register %s: %v", name, err)
	}
	return c
}

// cacheOn is newCache of 2 layers of 256 KiB (the peer scenarios' caches).
func cacheOn(t *testing.T, sc *proxytest.Sidecar, name string, seed uint64) *kvsim.Cache {
	t.Helper()
	return newCache(t, sc, name, 2, 256<<10, seed)
}

// run submits one transfer per layer at once and waits for all of them.
func run(t *testing.T, cl *client.Client, dir wire.Direction, tag string, local, remote *kvsim.Cache, ms []kvsim.Move) {
	t.Helper()
	if _, err := kvsim.RunLayers(context.Background(), cl, route, dir, tag, local, remote, ms, 60*time.Second); err != nil {
		t.Fatal(err)
	}
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

// link returns the stats of sc's link called name.
func link(t *testing.T, sc *proxytest.Sidecar, name string) wire.LinkStats {
	t.Helper()
	for _, l := range sc.Snapshot().Links {
		if l.Name == name {
			return l
		}
	}
	t.Fatalf("%s has no link %q", sc.Name, name)
	return wire.LinkStats{}
}

// scrape GETs path from sc's metrics listener.
func scrape(t *testing.T, sc *proxytest.Sidecar, path string) (int, string) {
	t.Helper()
	code, body, err := e2etest.Scrape(sc.MetricsURL(path))
	if err != nil {
		t.Fatal(err)
	}
	return code, body
}

// metricValue finds one sample ("name{labels} value") in an exposition.
func metricValue(body, series string) (float64, bool) { return e2etest.MetricValue(body, series) }

// metricReaches waits until sc's /metrics shows series at want (an
// absent series reads 0), for up to 10 s; it does not stop the test, so
// a goroutine may call it.
func metricReaches(sc *proxytest.Sidecar, series string, want float64) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body, err := e2etest.Scrape(sc.MetricsURL("/metrics"))
		if err != nil {
			return err
		}
		v, _ := metricValue(body, series)
		if v == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s's %s is %v after 10 s, want %v", sc.Name, series, v, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waiting runs do on a goroutine and waits until sc shows a peer's
// request of it waiting for what (grant, registration, inbox); do must
// not have ended by then. Its error comes on the channel.
func waiting(t *testing.T, sc *proxytest.Sidecar, what string, do func() error) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- do() }()
	if err := metricReaches(sc, fmt.Sprintf(`stage_kv_waiting{for=%q}`, what), 1); err != nil {
		t.Fatalf("a request before its %s: %v", what, err)
	}
	select {
	case err := <-done:
		t.Fatalf("a request before its %s ended before it came: %v", what, err)
	default:
	}
	return done
}

// metricsAre checks sc's /metrics for each series' value.
func metricsAre(t *testing.T, sc *proxytest.Sidecar, want map[string]float64) {
	t.Helper()
	_, body := scrape(t, sc, "/metrics")
	for series, v := range want {
		if got, ok := metricValue(body, series); !ok || got != v {
			t.Errorf("%s's %s: %v (present %v), want %v", sc.Name, series, got, ok, v)
		}
	}
}

// waitLogged waits until sc's log contains want.
func waitLogged(t *testing.T, sc *proxytest.Sidecar, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(sc.LogText(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%s's log never said %q:\n%s", sc.Name, want, sc.LogText())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
