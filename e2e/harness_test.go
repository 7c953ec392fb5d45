package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/e2e/e2etest"
	"github.com/stage-kv/stage/internal/sidecars"
	"github.com/stage-kv/stage/wire"
)

var stagedBin string

func TestMain(m *testing.M) {
	if sock := os.Getenv(engineEnv); sock != "" { // this binary run as an engine (restart_test.go)
		os.Exit(runEngine(sock))
	}
	// On a machine without Go (the GPU machine), STAGED_BIN names a
	// prebuilt staged.
	bin, cleanup, err := e2etest.Binary(raceBuild)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stagedBin = bin
	code := m.Run()
	cleanup()
	if code == 0 && os.Getenv(e2etest.BinEnv) == "" {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked in the test process:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// node is one staged process (sidecars.Process) and a client of it. Its
// fields repeat the process's under the names the tests use.
type node struct {
	t       *testing.T
	name    string
	proc    *sidecars.Process
	cmd     *exec.Cmd
	peers   string
	socket  string
	metrics string // host:port of /metrics, when enabled
	// config is the file staged runs with; configText its first contents.
	config, configText string
	log                string
	cl                 *client.Client
	base               wire.Stats // idle figures after start
}

type nodeOpts struct {
	route   string // route name, "" for none
	peer    string
	stripes int
	token   string
	slots   int
	slot    string   // slot size, default 1MiB
	extra   string   // more YAML
	env     []string // more environment
	// for pair(): the receiver's extra YAML and environment
	decExtra string
	decEnv   []string
	// nodeDir, when set, puts the sidecar on one "node" with every other
	// sidecar given the same nodeDir: a shared host id and node socket
	// directory. Otherwise each sidecar has a host id of its own, so
	// sidecars of one test machine talk TCP as on separate nodes.
	nodeDir   string
	transport string // the route's transport; empty: the default (auto)
	listen    string // peer listen address; empty: 127.0.0.1:0
}

// startNode starts staged with a config built from o and waits until it is ready.
func startNode(t *testing.T, name string, o nodeOpts) *node {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "s", name+".sock")
	if o.slots == 0 {
		o.slots = 16
	}
	if o.stripes == 0 {
		o.stripes = 2
	}
	if o.slot == "" {
		o.slot = "1MiB"
	}
	hostID, sockDir := "e2e-"+name, filepath.Join(dir, "node")
	if o.nodeDir != "" {
		hostID, sockDir = "e2e-one-node", o.nodeDir
	}
	// Node connections go after 2 s unused, well inside checkIdle's wait.
	cfg := sidecars.Config{Name: name, Socket: sock, Listen: o.listen, HostID: hostID, SocketDir: sockDir, NodeIdle: "2s",
		SlotSize: o.slot, Slots: o.slots, Extra: o.extra}
	if o.route != "" {
		cfg.Route, cfg.Peer, cfg.Stripes, cfg.Transport = o.route, o.peer, o.stripes, o.transport
		cfg.ConnectTimeout, cfg.ProgressTimeout = 2*time.Second, 10*time.Second
	}
	token := o.token
	if token == "" {
		token = "e2e-token"
	}
	p, err := sidecars.Start(context.Background(), sidecars.Options{Bin: stagedBin, Dir: dir, Name: name, Config: cfg.YAML(), Token: token, Env: o.env})
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, name: name, proc: p, cmd: p.Cmd, peers: p.Peers, socket: p.Socket, metrics: p.Metrics,
		config: p.ConfigPath, configText: cfg.YAML(), log: p.LogPath}
	if n.cl, err = client.Dial(n.socket); err != nil {
		_ = p.Stop(os.Interrupt, 20*time.Second)
		t.Fatal(err)
	}
	t.Cleanup(n.stop)
	return n
}

func (n *node) tail() string { return n.proc.Tail(30) }

func (n *node) stats() wire.Stats {
	n.t.Helper()
	st, err := n.cl.Stats(context.Background())
	if err != nil {
		n.t.Fatalf("%s stats: %v", n.name, err)
	}
	return *st
}

// settle records the idle figures once the node's sessions are up.
func (n *node) settle(sessions int) {
	n.t.Helper()
	var err error
	if n.base, err = e2etest.Settle(context.Background(), n.cl, sessions, 10*time.Second); err != nil {
		n.t.Fatalf("%s: %v\n%s", n.name, err, n.tail())
	}
}

// checkIdle fails unless the node is back to its idle figures (see
// e2etest.CheckIdle).
func (n *node) checkIdle() {
	n.t.Helper()
	if err := e2etest.CheckIdle(context.Background(), n.cl, n.base, 10*time.Second); err != nil {
		n.t.Errorf("%s leaked: %v", n.name, err)
	}
}

// stop sends SIGINT and requires a clean exit.
func (n *node) stop() {
	if n.cl != nil {
		n.cl.Close()
		n.cl = nil
	}
	if err := n.proc.Stop(os.Interrupt, 20*time.Second); err != nil {
		n.t.Error(err)
	}
}

// pair starts a receiver ("decode") and a sender ("prefill") with route
// "decode" between them, and waits for the session.
func pair(t *testing.T, o nodeOpts) (pre, dec *node) {
	t.Helper()
	dec = startNode(t, "decode", nodeOpts{token: o.token, slots: o.slots, extra: o.decExtra, env: o.decEnv, nodeDir: o.nodeDir})
	o.route, o.peer = "decode", dec.peers
	pre = startNode(t, "prefill", o)
	pre.settle(1)
	dec.settle(1)
	// Registered after the nodes' stop and before any cache the test
	// registers, so it runs once the test's regions are gone and while
	// the nodes still run.
	t.Cleanup(func() {
		pre.checkIdle()
		dec.checkIdle()
	})
	return pre, dec
}
