package netns

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// labEnv carries the lab's layout from the outer run to the inner one.
const labEnv = "STAGE_NETNS_LAB"

// nsPrefix starts the name of every namespace these tests make; the
// outer run's pid follows, so a run can tell its own leftovers from a
// live run's namespaces.
const nsPrefix = "stfx"

// lab is a hub namespace with a bridge and one namespace per sidecar,
// each with one address on the bridge's subnet.
type lab struct {
	Hub   string   `json:"hub"`
	HubIP string   `json:"hub_ip"`
	NS    []string `json:"ns"`
	IPs   []string `json:"ips"`
}

var labSeq atomic.Int32

// addr is where the sidecar of namespace i listens for peers.
func (l *lab) addr(i int) string { return l.IPs[i] + ":" + strconv.Itoa(peerPort) }

// inLab runs the calling test inside a lab of n sidecar namespaces. In the
// outer run it builds the lab, runs the test again inside the hub, deletes
// the lab and returns nil: the caller returns at once. In the inner run
// it returns the lab, and the caller does the work.
func inLab(t *testing.T, n int) *lab {
	t.Helper()
	if v := os.Getenv(labEnv); v != "" {
		var l lab
		if err := json.Unmarshal([]byte(v), &l); err != nil {
			t.Fatalf("decode %s: %v", labEnv, err)
		}
		return &l
	}
	requireNetns(t)
	l := buildLab(t, n)
	l.runInside(t)
	return nil
}

// requireNetns skips (fails with STAGE_NETNS_REQUIRED=1) without root or
// a working `ip netns`.
func requireNetns(t *testing.T) {
	t.Helper()
	missing := func(why string) {
		t.Helper()
		if os.Getenv("STAGE_NETNS_REQUIRED") == "1" {
			t.Fatalf("netns tests required (STAGE_NETNS_REQUIRED=1) but %s", why)
		}
		t.Skipf("skipped: %s (run as root with iproute2 and nftables installed)", why)
	}
	if os.Geteuid() != 0 {
		missing("not root: network namespaces need CAP_SYS_ADMIN")
	}
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil {
		missing(fmt.Sprintf("`ip netns list` failed: %v %s", err, out))
	}
	if _, err := exec.LookPath("nft"); err != nil {
		missing("nft is not installed")
	}
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ipBatch runs commands in one `ip -n ns -batch -`.
func ipBatch(ns string, cmds []string) error {
	c := exec.Command("ip", "-n", ns, "-batch", "-")
	c.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("ip -n %s -batch (%s): %w: %s", ns, strings.Join(cmds, "; "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// buildLab makes the namespaces and registers their deletion.
func buildLab(t *testing.T, n int) *lab {
	t.Helper()
	removeStale(t)
	base := fmt.Sprintf("%s%d-%d-", nsPrefix, os.Getpid(), labSeq.Add(1))
	l := &lab{Hub: base + "hub", HubIP: "198.18.0.1"}
	t.Cleanup(func() { l.destroy(t) })
	if err := ipCmd("netns", "add", l.Hub); err != nil {
		t.Fatal(err)
	}
	hub := []string{"link set lo up", "link add br0 type bridge", "addr add " + l.HubIP + "/24 dev br0", "link set br0 up"}
	for i := 0; i < n; i++ {
		ns := base + strconv.Itoa(i)
		if err := ipCmd("netns", "add", ns); err != nil {
			t.Fatal(err)
		}
		l.NS = append(l.NS, ns)
		l.IPs = append(l.IPs, fmt.Sprintf("198.18.0.%d", 10+i))
		v := fmt.Sprintf("v%d", i)
		hub = append(hub, fmt.Sprintf("link add %s type veth peer name eth0 netns %s", v, ns),
			fmt.Sprintf("link set %s master br0 up", v))
	}
	if err := ipBatch(l.Hub, hub); err != nil {
		t.Fatal(err)
	}
	for i, ns := range l.NS {
		if err := ipBatch(ns, []string{"link set lo up", "addr add " + l.IPs[i] + "/24 dev eth0", "link set eth0 up"}); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// runInside runs the calling test again in the hub namespace.
func (l *lab) runInside(t *testing.T) {
	t.Helper()
	js, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"netns", "exec", l.Hub, exe, "-test.run", "^" + t.Name() + "$", "-test.count=1", "-test.v"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout", time.Until(d).Truncate(time.Second).String())
	}
	c := exec.Command("ip", args...)
	c.Env = append(os.Environ(), labEnv+"="+string(js), "STAGED_BIN="+stagedBin)
	c.Stdout, c.Stderr = os.Stdout, os.Stderr
	// The inner run dies with this one (Pdeathsig follows the thread
	// that started it, so hold the thread).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Run(); err != nil {
		t.Fatalf("%s inside the lab: %v", t.Name(), err)
	}
}

// destroy kills what still runs in the namespaces and deletes them.
func (l *lab) destroy(t *testing.T) {
	for _, ns := range append(append([]string(nil), l.NS...), l.Hub) {
		if err := deleteNS(ns); err != nil {
			t.Errorf("lab teardown: %v", err)
		}
	}
}

// deleteNS kills the processes in ns (all started by these tests) and
// deletes it; a namespace that is not there is no error.
func deleteNS(ns string) error {
	if _, err := os.Stat("/run/netns/" + ns); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return fmt.Errorf("ip netns pids %s: %w", ns, err)
	}
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return fmt.Errorf("ip netns pids %s: %q: %w", ns, f, err)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill %d in %s: %w", pid, ns, err)
		}
	}
	return ipCmd("netns", "del", ns)
}

// removeStale deletes namespaces left by runs that died (their pid is
// gone) before they could clean up.
func removeStale(t *testing.T) {
	t.Helper()
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		return // none made yet
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), nsPrefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			if err := deleteNS(e.Name()); err != nil {
				t.Logf("stale namespace %s: %v", e.Name(), err)
			}
		}
	}
}
