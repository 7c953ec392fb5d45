package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/wire"
)

var stagedBin string

func TestMain(m *testing.M) {
	// On a machine without Go (the GPU machine), STAGED_BIN names a
	// prebuilt staged.
	if p := os.Getenv("STAGED_BIN"); p != "" {
		stagedBin = p
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "stage-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stagedBin = filepath.Join(dir, "staged")
	args := []string{"build", "-o", stagedBin}
	if raceBuild {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, "github.com/stage-kv/stage/cmd/staged")...).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build staged: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked in the test process:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// node is one staged process.
type node struct {
	t       *testing.T
	name    string
	cmd     *exec.Cmd
	peers   string
	socket  string
	metrics string // host:port of /metrics, when enabled
	// config is the file staged runs with; configText its first contents.
	config, configText string
	log                string
	exited             chan error
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
	if o.listen == "" {
		o.listen = "127.0.0.1:0"
	}
	cfg := fmt.Sprintf("node:\n  name: %s\n  host_id: %s\n  socket_dir: %s\nlisten: %s\ncontrol_socket: %s\nstaging:\n  slot_size: %s\n  slots: %d\n  window: %d\n",
		name, hostID, sockDir, o.listen, sock, o.slot, o.slots, o.slots/2)
	if o.route != "" {
		cfg += fmt.Sprintf("routes:\n  - name: %s\n    peers: [%q]\n    stripes: %d\n    connect_timeout: 2s\n    progress_timeout: 10s\n", o.route, o.peer, o.stripes)
		if o.transport != "" {
			cfg += fmt.Sprintf("    transport: %s\n", o.transport)
		}
	}
	cfg += o.extra
	n := &node{}
	path := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	n.config, n.configText = path, cfg
	token := o.token
	if token == "" {
		token = "e2e-token"
	}
	n.t, n.name, n.log, n.exited = t, name, filepath.Join(dir, name+".log"), make(chan error, 1)
	logf, err := os.Create(n.log)
	if err != nil {
		t.Fatal(err)
	}
	n.cmd = exec.Command(stagedBin, "--config", path)
	n.cmd.Env = append(append(os.Environ(), "STAGE_SECURITY_TOKEN="+token), o.env...)
	n.cmd.Stderr = logf
	out, err := n.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "staged ready ") {
				ready <- sc.Text()
			}
		}
	}()
	go func() { n.exited <- n.cmd.Wait(); logf.Close() }()
	select {
	case line := <-ready:
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "peers="); ok {
				n.peers = v
			}
			if v, ok := strings.CutPrefix(f, "socket="); ok {
				n.socket = v
			}
			if v, ok := strings.CutPrefix(f, "metrics="); ok {
				n.metrics = v
			}
		}
	case err := <-n.exited:
		t.Fatalf("%s exited before ready: %v\n%s", name, err, n.tail())
	case <-time.After(15 * time.Second):
		_ = n.cmd.Process.Kill()
		t.Fatalf("%s not ready in 15s\n%s", name, n.tail())
	}
	n.cl, err = client.Dial(n.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.stop)
	return n
}

func (n *node) tail() string {
	b, _ := os.ReadFile(n.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

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
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := n.stats()
		if st.Sessions >= sessions {
			time.Sleep(100 * time.Millisecond) // let session goroutines start
			n.base = n.stats()
			return
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("%s: %d sessions after 10s, want %d\n%s", n.name, st.Sessions, sessions, n.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkIdle fails unless the node is back to its idle figures: no slot in
// use, no transfer active, no region or mapping left (the test unregistered
// its own), goroutines and fds as at settle.
func (n *node) checkIdle() {
	n.t.Helper()
	var st wire.Stats
	deadline := time.Now().Add(10 * time.Second)
	for {
		st = n.stats()
		if st.SendInUse == 0 && st.RecvInUse == 0 && st.Transfers == 0 && st.Regions == n.base.Regions &&
			st.Mappings == n.base.Mappings && st.PeerMappings == 0 && st.Goroutines <= n.base.Goroutines && st.FDs <= n.base.FDs {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.t.Errorf("%s leaked: send slots %d, recv slots %d, transfers %d, regions %d (was %d), mappings %d (was %d), peer mappings %d, goroutines %d (was %d), fds %d (was %d)",
		n.name, st.SendInUse, st.RecvInUse, st.Transfers, st.Regions, n.base.Regions, st.Mappings, n.base.Mappings, st.PeerMappings,
		st.Goroutines, n.base.Goroutines, st.FDs, n.base.FDs)
}

// stop sends SIGTERM and requires a clean exit.
func (n *node) stop() {
	if n.cl != nil {
		n.cl.Close()
		n.cl = nil
	}
	if n.cmd.ProcessState != nil {
		return
	}
	_ = n.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-n.exited:
		if err != nil {
			n.t.Errorf("%s exited with %v\n%s", n.name, err, n.tail())
		}
	case <-time.After(20 * time.Second):
		_ = n.cmd.Process.Kill()
		n.t.Errorf("%s did not exit within 20s of SIGINT\n%s", n.name, n.tail())
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
