// Package proxytest runs sidecars inside a test process: proxy.Servers on
// the hostmem backend, peers over loopback TCP, each with its control
// socket in the test's temporary directory and a client dialled to it.
// It uses proxy's exported API only, so what it drives is what staged
// runs; a test of one sidecar's internals belongs in package proxy, a
// test of two sidecars talking belongs here (or, with real processes,
// in e2e).
//
// Everything a sidecar holds is released by the test's cleanups.
package proxytest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	_ "github.com/stage-kv/stage/device/hostmem" // the backend every sidecar here runs on
	"github.com/stage-kv/stage/proxy"
)

// Route is the name of the route Pair gives the sending sidecar.
const Route = "decode"

// Options shape the sidecars; zero fields take the defaults named.
type Options struct {
	Token     string          // security.token; "proxytest-token"
	SlotSize  config.ByteSize // staging.slot_size; 256 KiB
	Slots     int             // staging.slots; 8 (window half of it)
	Stripes   int             // the route's data streams; 2
	Transport string          // the route's transport; "tcp"
	Metrics   bool            // serve /metrics, /healthz, /readyz on a loopback port (MetricsURL)
	// NodeDir, when set (from NodeDir), puts every sidecar given it on one
	// node: one host id, one node socket directory, so the same-node
	// transports (ipc, shm) apply. Otherwise each sidecar is a node of its
	// own and they talk TCP as across machines.
	NodeDir string
	// Configure, when set, edits each config last, before validation
	// (name is the sidecar's).
	Configure func(name string, c *config.Config)
}

// Sidecar is one running proxy.Server and a client on its control socket.
type Sidecar struct {
	*proxy.Server
	Name   string
	Config *config.Config
	// Client joined Group, a token of its own: Dial's connections share
	// its regions, KV caches, transfers and notifications.
	Client *client.Client
	Group  []byte
	Logs   *observer.ObservedLogs // what the sidecar logged, debug lines too
}

// Start runs a sidecar called name; with peer set, it has one route, Route,
// to that address. The config is validated as staged's is.
func Start(t testing.TB, name, peer string, o Options) *Sidecar {
	t.Helper()
	c := o.config(t, name, peer)
	core, logs := observer.New(zapcore.DebugLevel)
	s, err := proxy.New(c, zap.New(core).Named(name))
	if err != nil {
		t.Fatalf("proxytest: sidecar %s: %v", name, err)
	}
	if err := s.Start(context.Background()); err != nil {
		_ = s.Close()
		t.Fatalf("proxytest: start sidecar %s: %v", name, err)
	}
	sc := &Sidecar{Server: s, Name: name, Config: c, Logs: logs}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("proxytest: close sidecar %s: %v", name, err)
		}
	})
	sc.Group = []byte(fmt.Sprintf("proxytest-group-%s-%p", name, sc))
	if sc.Client, err = client.Dial(s.SocketPath()); err != nil {
		t.Fatalf("proxytest: dial sidecar %s: %v", name, err)
	}
	// Registered after the server's Close, so it runs first.
	t.Cleanup(func() { sc.Client.Close() })
	if err := sc.Client.Join(context.Background(), sc.Group); err != nil {
		t.Fatalf("proxytest: join sidecar %s's group: %v", name, err)
	}
	return sc
}

// Dial opens another connection to the sidecar in Client's group; the
// test's cleanup closes it.
func (s *Sidecar) Dial(t testing.TB, opts ...client.Option) *client.Client {
	t.Helper()
	cl, err := client.Dial(s.SocketPath(), opts...)
	if err != nil {
		t.Fatalf("proxytest: dial sidecar %s: %v", s.Name, err)
	}
	t.Cleanup(func() { cl.Close() })
	if err := cl.Join(context.Background(), s.Group); err != nil {
		t.Fatalf("proxytest: join sidecar %s's group: %v", s.Name, err)
	}
	return cl
}

// config builds the sidecar's config from the defaults and o.
func (o Options) config(t testing.TB, name, peer string) *config.Config {
	t.Helper()
	dir := shortTempDir(t)
	c := config.Default()
	c.Node.Name, c.Node.HostID, c.Node.SocketDir = name, "proxytest-"+name, filepath.Join(dir, "node")
	if o.NodeDir != "" {
		c.Node.HostID, c.Node.SocketDir = "proxytest-one-node", o.NodeDir
	}
	c.Listen, c.ControlSocket = "127.0.0.1:0", filepath.Join(dir, name+".sock")
	c.Staging.SlotSize, c.Staging.Slots = orDefault(o.SlotSize, 256*config.KiB), orDefault(o.Slots, 8)
	c.Staging.Window = max(1, c.Staging.Slots/2)
	c.Security.Token = orDefault(o.Token, "proxytest-token")
	if o.Metrics {
		c.Metrics.Listen = "127.0.0.1:0"
	}
	if peer != "" {
		c.Routes = []config.Route{o.RouteTo(peer)}
	}
	if o.Configure != nil {
		o.Configure(name, c)
	}
	if err := config.Validate(c); err != nil {
		t.Fatalf("proxytest: sidecar %s: %v", name, err)
	}
	return c
}

// RouteTo is the route Start gives a sidecar with a peer, to peers: named
// Route, o's stripes and transport, a 2 s connect_timeout and a 10 s
// progress_timeout, every other key at staged's default. Tests build
// routes of several peers (or reloads, ApplyRoutes) from it.
func (o Options) RouteTo(peers ...string) config.Route {
	return config.Route{Name: Route, Peers: peers, Stripes: orDefault(o.Stripes, 2), Transport: orDefault(o.Transport, "tcp"),
		Checksum: config.DefaultRouteChecksum, ConnectTimeout: 2 * time.Second, ProgressTimeout: 10 * time.Second,
		Pick: config.DefaultRoutePick, IdleTimeout: config.DefaultRouteIdleTimeout, DNSInterval: config.DefaultRouteDNSInterval}
}

// NodeDir returns a node socket directory for sidecars that share a node
// (Options.NodeDir), removed when the test ends.
func NodeDir(t testing.TB) string {
	t.Helper()
	return filepath.Join(shortTempDir(t), "n")
}

// shortTempDir is a new directory under the system's temporary one with a
// short name: t.TempDir's names the test, and a Unix socket's path has at
// most 107 bytes.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Pair runs a receiving sidecar ("decode") and a sending one ("prefill")
// with Route to it, and waits until each counts the session between them.
//
// When the test ends, both must be idle before they close (ExpectIdle),
// and the process must hold no goroutine or fd more after (NoLeaks).
func Pair(t testing.TB, o Options) (pre, dec *Sidecar) {
	t.Helper()
	NoLeaks(t)
	dec = Start(t, "decode", "", o)
	pre = Start(t, "prefill", dec.PeerAddr(), o)
	pre.ExpectIdle(t, 1)
	dec.ExpectIdle(t, 1)
	return pre, dec
}

// WaitSessions waits until the sidecar has at least n peer sessions.
func (s *Sidecar) WaitSessions(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		got := s.Snapshot().Sessions
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proxytest: sidecar %s has %d sessions after %v, want %d", s.Name, got, timeout, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
