package netns

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/wire"
)

// labToken is every lab sidecar's security token.
const labToken = "netns-token"

// peerPort is every sidecar's peer port: each has an address of its own,
// and a restarted sidecar must come back where its peers dial.
const peerPort = 7100

// route is one route of a sidecar's config.
type route struct {
	name, peer string
	stripes    int
	progress   time.Duration
}

// spec says how to run one sidecar.
type spec struct {
	name      string
	routes    []route
	slotSize  string // default 256KiB
	slots     int    // default 16
	window    int    // credits granted to each peer; default slots/2
	extraYAML string
}

// sidecar is one staged process in its own namespace; it can be killed,
// stopped and started again with the same config and address.
type sidecar struct {
	t        *testing.T
	name     string
	ns, ip   string
	peerAddr string
	config   string
	log      string
	socket   string
	cmd      *exec.Cmd
	exited   chan error
	cl       *client.Client
	book     *noteBook // its notifications, once asked for
}

func (s spec) yaml(ip, socket string) string {
	slotSize, slots := s.slotSize, s.slots
	if slotSize == "" {
		slotSize = "256KiB"
	}
	if slots == 0 {
		slots = 16
	}
	window := s.window
	if window == 0 {
		window = slots / 2
	}
	var b strings.Builder
	// Each namespace stands for a host of its own: a host id of its own
	// keeps the sidecars off the same-node paths, on TCP through the lab.
	fmt.Fprintf(&b, "node:\n  name: %s\n  host_id: lab-%s\nlisten: %s:%d\ncontrol_socket: %s\n", s.name, s.name, ip, peerPort, socket)
	fmt.Fprintf(&b, "staging:\n  slot_size: %s\n  slots: %d\n  window: %d\ndrain_timeout: 2s\n", slotSize, slots, window)
	if len(s.routes) > 0 {
		b.WriteString("routes:\n")
	}
	for _, r := range s.routes {
		if r.stripes == 0 {
			r.stripes = 2
		}
		if r.progress == 0 {
			r.progress = 10 * time.Second
		}
		fmt.Fprintf(&b, "  - name: %s\n    peers: [%q]\n    stripes: %d\n    connect_timeout: 3s\n    progress_timeout: %s\n",
			r.name, r.peer, r.stripes, r.progress)
	}
	b.WriteString(s.extraYAML)
	return b.String()
}

// startSidecar runs staged for s in the lab's namespace i and waits until
// it serves its socket. Cleanup stops it.
func startSidecar(t *testing.T, l *lab, i int, s spec) *sidecar {
	t.Helper()
	dir := t.TempDir()
	sc := &sidecar{t: t, name: s.name, ns: l.NS[i], ip: l.IPs[i], peerAddr: l.addr(i),
		config: filepath.Join(dir, s.name+".yaml"), log: filepath.Join(dir, s.name+".log"),
		socket: filepath.Join(dir, "s", s.name+".sock")}
	if err := os.WriteFile(sc.config, []byte(s.yaml(sc.ip, sc.socket)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := sc.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.stop)
	t.Cleanup(func() { // before the stop: what the sidecar saw, for a failure
		if t.Failed() {
			t.Logf("%s's log, last lines:\n%s", sc.name, sc.tail())
		}
	})
	return sc
}

// addr is where peers reach the sidecar.
func (sc *sidecar) addr() string { return sc.peerAddr }

func (sc *sidecar) start() error {
	logf, err := os.OpenFile(sc.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", sc.log, err)
	}
	c := exec.Command("ip", "netns", "exec", sc.ns, stagedBin, "--config", sc.config)
	c.Env = append(os.Environ(), "STAGE_SECURITY_TOKEN="+labToken)
	c.Stderr = logf
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := c.StdoutPipe()
	if err != nil {
		logf.Close()
		return fmt.Errorf("%s stdout: %w", sc.name, err)
	}
	if err := c.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", sc.name, err)
	}
	sc.cmd, sc.exited = c, make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		scan := bufio.NewScanner(out)
		for scan.Scan() {
			if strings.HasPrefix(scan.Text(), "staged ready ") {
				close(ready)
			}
		}
	}()
	exited := sc.exited
	go func() { exited <- c.Wait(); logf.Close() }()
	select {
	case <-ready:
	case err := <-exited:
		exited <- err
		return fmt.Errorf("%s exited before ready: %v\n%s", sc.name, err, sc.tail())
	case <-time.After(20 * time.Second):
		_ = c.Process.Kill()
		return fmt.Errorf("%s not ready in 20s\n%s", sc.name, sc.tail())
	}
	sc.cl, err = client.Dial(sc.socket)
	if err != nil {
		return fmt.Errorf("dial %s's socket: %w", sc.name, err)
	}
	sc.book = nil
	return nil
}

// notes returns the sidecar's notifications, subscribing on first use
// (one subscription per client connection, shared by every user).
func (sc *sidecar) notes() *noteBook {
	sc.t.Helper()
	if sc.book == nil {
		sc.book = watch(sc.t, sc.cl)
	}
	return sc.book
}

func (sc *sidecar) pid() int { return sc.cmd.Process.Pid }

// signal sends sig to the sidecar.
func (sc *sidecar) signal(sig syscall.Signal) {
	sc.t.Helper()
	if err := sc.cmd.Process.Signal(sig); err != nil {
		sc.t.Fatalf("signal %v to %s: %v", sig, sc.name, err)
	}
}

// kill SIGKILLs the sidecar and waits for it to be gone. Its engine's
// connection is closed after the kill, so that the sidecar dies in the
// middle of what it was doing rather than reacting to its engine leaving.
func (sc *sidecar) kill() {
	sc.t.Helper()
	sc.signal(syscall.SIGKILL)
	select {
	case err := <-sc.exited:
		sc.exited <- err // for stop: gone already
	case <-time.After(10 * time.Second):
		sc.t.Fatalf("%s still running 10s after SIGKILL", sc.name)
	}
	sc.closeClient()
}

// restart starts a killed sidecar again, same config and address.
func (sc *sidecar) restart() {
	sc.t.Helper()
	if err := sc.start(); err != nil {
		sc.t.Fatal(err)
	}
}

func (sc *sidecar) closeClient() {
	if sc.cl != nil {
		if err := sc.cl.Close(); err != nil {
			sc.t.Logf("%s: close client: %v", sc.name, err)
		}
		sc.cl = nil
	}
}

// stop sends SIGTERM and requires a clean exit (a sidecar already gone is
// left alone).
func (sc *sidecar) stop() {
	sc.closeClient()
	select {
	case err := <-sc.exited:
		sc.exited <- err
		return
	default:
	}
	_ = sc.cmd.Process.Signal(syscall.SIGCONT) // in case a trial left it stopped
	_ = sc.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-sc.exited:
		if err != nil {
			sc.t.Errorf("%s exited with %v\n%s", sc.name, err, sc.tail())
		}
	case <-time.After(20 * time.Second):
		_ = sc.cmd.Process.Kill()
		sc.t.Errorf("%s did not exit within 20s of SIGTERM\n%s", sc.name, sc.tail())
	}
}

func (sc *sidecar) tail() string {
	b, err := os.ReadFile(sc.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

func (sc *sidecar) stats() wire.Stats {
	sc.t.Helper()
	st, err := sc.cl.Stats(context.Background())
	if err != nil {
		sc.t.Fatalf("%s stats: %v", sc.name, err)
	}
	return *st
}

// waitSessions waits until the sidecar has n peer sessions up.
func (sc *sidecar) waitSessions(n int, within time.Duration) {
	sc.t.Helper()
	deadline := time.Now().Add(within)
	for {
		st := sc.stats()
		if st.Sessions == n {
			return
		}
		if time.Now().After(deadline) {
			sc.t.Fatalf("%s: %d sessions after %v, want %d\n%s", sc.name, st.Sessions, within, n, sc.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// idle is a sidecar's resting figures, for leak checks.
type idle struct{ goroutines, fds int }

// baseline waits for the figures to settle and records them.
func (sc *sidecar) baseline() idle {
	sc.t.Helper()
	time.Sleep(200 * time.Millisecond) // session goroutines start
	st := sc.stats()
	return idle{st.Goroutines, procFDs(sc.t, sc.pid())}
}

// checkIdle fails unless the sidecar returns to base within 10s: no
// pinned slot in use, no transfer active, goroutines and fds (its own
// count and /proc's) no more than at base.
func (sc *sidecar) checkIdle(base idle) {
	sc.t.Helper()
	var st wire.Stats
	var fds int
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, fds = sc.stats(), procFDs(sc.t, sc.pid())
		if st.SendInUse == 0 && st.RecvInUse == 0 && st.Transfers == 0 && st.Goroutines <= base.goroutines && fds <= base.fds {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	sc.t.Errorf("%s leaked: send slots %d, recv slots %d, transfers %d, goroutines %d (idle %d), fds %d (idle %d): %s\n%s",
		sc.name, st.SendInUse, st.RecvInUse, st.Transfers, st.Goroutines, base.goroutines, fds, base.fds, procFDNames(sc.pid()), sc.tail())
}

// procFDNames lists what the process's fds point at, for a leak report.
func procFDNames(pid int) string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err.Error()
	}
	var names []string
	for _, e := range ents {
		l, _ := os.Readlink(dir + "/" + e.Name())
		names = append(names, e.Name()+"="+l)
	}
	return strings.Join(names, " ")
}

// procFDs counts the process's open fds from /proc.
func procFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("count fds of %d: %v", pid, err)
	}
	return len(ents)
}

// procStatus reads the memory figures (the lines in kB) of
// /proc/PID/status, in bytes: VmRSS, VmHWM, RssAnon, RssShmem, ...
func procStatus(pid int) (map[string]uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, fmt.Errorf("read status of %d: %w", pid, err)
	}
	m := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		key, val, ok := strings.Cut(line, ":")
		num, isKB := strings.CutSuffix(strings.TrimSpace(val), " kB")
		if !ok || !isKB {
			continue
		}
		kb, err := strconv.ParseUint(num, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("status of %d: %q: %w", pid, line, err)
		}
		m[key] = kb << 10
	}
	return m, nil
}
