package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// zcRefused reports whether err is the kernel refusing SO_ZEROCOPY.
func zcRefused(err error) bool {
	return errors.Is(err, unix.ENOPROTOOPT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)
}

// openFDs counts the process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	e, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("list open fds: %v", err)
	}
	return len(e)
}

// checkResult holds r to what a run of o must report.
func checkResult(t *testing.T, r Result, impl, mode string, conns int, total, chunk int64) {
	t.Helper()
	want := total * int64(conns)
	if !r.Locked {
		t.Errorf("%s %s: not locked, want per-thread CPU", impl, mode)
	}
	if r.Impl != impl || r.Mode != mode || r.Conns != conns || r.Total != total || r.Chunk != chunk {
		t.Errorf("result names %s %s conns %d total %d chunk %d, want %s %s %d %d %d", r.Impl, r.Mode, r.Conns, r.Total, r.Chunk, impl, mode, conns, total, chunk)
	}
	if r.Sent != want || r.Received != want {
		t.Errorf("sent %d B, received %d B, want %d B each", r.Sent, r.Received, want)
	}
	if r.Seconds <= 0 || r.GBps <= 0 {
		t.Errorf("seconds %v, GB/s %v: want both > 0", r.Seconds, r.GBps)
	}
	if r.SendCPU <= 0 || r.RecvCPU <= 0 || r.ProcCPU <= 0 || r.SendPerGB <= 0 || r.RecvPerGB <= 0 || r.PerCore <= 0 {
		t.Errorf("CPU figures: send %v s (%v s/GB), recv %v s (%v s/GB), proc %v s, per core %v GB/s: want all > 0",
			r.SendCPU, r.SendPerGB, r.RecvCPU, r.RecvPerGB, r.ProcCPU, r.PerCore)
	}
	if r.HostCPU < 0 || r.HostSoft < 0 || r.HostSoft > r.HostCPU {
		t.Errorf("host CPU %v s, softirq %v s: want 0 <= softirq <= busy", r.HostCPU, r.HostSoft)
	}
	if mode == "zerocopy" {
		// Every send's completion was reaped before the sender ended:
		// at least one id per chunk, more where a send went in parts.
		if r.ZCSends < want/chunk || r.ZCCopied < 0 || r.ZCCopied > r.ZCSends {
			t.Errorf("zerocopy completions %d (copied %d), want >= %d, copied within them", r.ZCSends, r.ZCCopied, want/chunk)
		}
		t.Logf("zerocopy on loopback: %d completions, %d flagged copied", r.ZCSends, r.ZCCopied)
	} else if r.ZCSends != 0 || r.ZCCopied != 0 {
		t.Errorf("%s reports zerocopy completions %d/%d", mode, r.ZCSends, r.ZCCopied)
	}
}

// decodeStrict decodes one JSON result, refusing keys Result lacks.
func decodeStrict(t *testing.T, b []byte) Result {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	var r Result
	if err := d.Decode(&r); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	var keys map[string]any
	if err := json.Unmarshal(b, &keys); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	for _, f := range reflect.VisibleFields(reflect.TypeOf(r)) {
		if k, _, _ := strings.Cut(f.Tag.Get("json"), ","); keys[k] == nil {
			t.Errorf("output lacks key %q: %s", k, b)
		}
	}
	return r
}

// TestModes moves 64 MiB over 2 connections in every mode, through the
// command line with --json, head and ring of several slots included.
func TestModes(t *testing.T) {
	fds := openFDs(t)
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			var out bytes.Buffer
			err := cli([]string{"--conns", "2", "--total", "32MiB", "--chunk", "1MiB", "--ring", "4MiB", "--head", "56", "--mode", mode, "--json"}, &out)
			if mode == "zerocopy" && zcRefused(err) {
				t.Skipf("this kernel refuses SO_ZEROCOPY on loopback TCP, so zerocopy is not measured here: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := decodeStrict(t, out.Bytes())
			checkResult(t, r, "go", mode, 2, 32<<20, 1<<20)
			if r.Head != 56 || r.Ring != 4<<20 {
				t.Errorf("head %d ring %d, want 56 and 4MiB", r.Head, r.Ring)
			}
		})
	}
	if n := openFDs(t); n != fds {
		t.Errorf("%d fds open after the runs, %d before", n, fds)
	}
}

// TestHotRingLine runs the hot case (ring = chunk) with socket buffers
// set and a last chunk short, and prints the human-readable line.
func TestHotRingLine(t *testing.T) {
	for _, mode := range modes {
		var out bytes.Buffer
		err := cli([]string{"--conns", "1", "--total", "5000000", "--chunk", "1MiB", "--ring", "1MiB", "--sndbuf", "1MiB", "--mode", mode}, &out)
		if mode == "zerocopy" && zcRefused(err) {
			t.Logf("zerocopy skipped: SO_ZEROCOPY refused: %v", err)
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		line := out.String()
		if !strings.HasPrefix(line, "go "+mode) || !strings.Contains(line, "ring 1MiB sndbuf 1MiB") || !strings.Contains(line, "0.01 GB in") {
			t.Errorf("%s: line %q lacks the run's names or bytes", mode, line)
		}
	}
}

// TestSpin runs stage's readers' polling window on the receivers.
func TestSpin(t *testing.T) {
	var out bytes.Buffer
	if err := cli([]string{"--conns", "2", "--total", "8MiB", "--chunk", "1MiB", "--ring", "2MiB", "--spin", "50us", "--json"}, &out); err != nil {
		t.Fatal(err)
	}
	r := decodeStrict(t, out.Bytes())
	checkResult(t, r, "go", "writev", 2, 8<<20, 1<<20)
	if r.SpinUS != 50 {
		t.Errorf("spin_us %d, want 50", r.SpinUS)
	}
}

// TestUnlocked runs net and writev with goroutines free to move between
// threads: no per-side CPU, the per-core figure from the process's.
func TestUnlocked(t *testing.T) {
	for _, mode := range []string{"net", "writev"} {
		var out bytes.Buffer
		if err := cli([]string{"--conns", "2", "--total", "8MiB", "--chunk", "1MiB", "--ring", "2MiB", "--lock=false", "--mode", mode, "--json"}, &out); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		r := decodeStrict(t, out.Bytes())
		if r.Locked || r.SendCPU != -1 || r.RecvCPU != -1 || r.SendPerGB != -1 || r.ProcCPU <= 0 || r.PerCore <= 0 || r.Received != 16<<20 {
			t.Errorf("%s unlocked: %+v: want locked false, -1 per side, process CPU and per core > 0, 16 MiB", mode, r)
		}
		var line bytes.Buffer
		if err := cli([]string{"--conns", "1", "--total", "1MiB", "--chunk", "1MiB", "--ring", "1MiB", "--lock=false", "--mode", mode}, &line); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if !strings.HasPrefix(line.String(), "go "+mode+"/unlocked") {
			t.Errorf("%s unlocked: line %q does not say unlocked", mode, line.String())
		}
	}
}

// failing fails its third send, as a peer that went away would.
type failing struct {
	sender
	n int
}

func (f *failing) send(slot int, head, payload []byte) error {
	if f.n++; f.n == 3 {
		return unix.EPIPE
	}
	return f.sender.send(slot, head, payload)
}

// TestSendFails: one sender failing mid-run wakes every receiver and
// sender, and the run fails naming it, with no goroutine or fd left.
func TestSendFails(t *testing.T) {
	defer func(f func(options, net.Conn) (sender, error)) { newSenderFn = f }(newSenderFn)
	calls := 0
	newSenderFn = func(o options, c net.Conn) (sender, error) {
		s, err := newSender(o, c)
		if calls++; calls == 2 && err == nil {
			s = &failing{sender: s}
		}
		return s, err
	}
	fds := openFDs(t)
	for _, mode := range modes {
		calls = 0
		_, err := run(options{conns: 3, total: 64 << 20, chunk: 1 << 20, ring: 2 << 20, mode: mode, lock: true})
		if mode == "zerocopy" && zcRefused(err) {
			continue
		}
		if !errors.Is(err, unix.EPIPE) || !strings.Contains(err.Error(), "sender 1: send 1048576 B at 2097152") {
			t.Errorf("%s: %v, want sender 1's EPIPE at its third chunk", mode, err)
		}
	}
	if n := openFDs(t); n != fds {
		t.Errorf("%d fds open after the failed runs, %d before", n, fds)
	}
}

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want options
		err  string
	}{
		{nil, options{conns: 8, total: 4 << 30, chunk: 4 << 20, ring: 16 << 20, mode: "writev", lock: true}, ""},
		{[]string{"--lock=false", "--mode", "net", "--spin", "100us"}, options{conns: 8, total: 4 << 30, chunk: 4 << 20, ring: 16 << 20, mode: "net", spin: 100 * time.Microsecond}, ""},
		{[]string{"--spin", "2s"}, options{}, "--spin 2s"},
		{[]string{"--conns", "1", "--total", "64K", "--chunk", "4096", "--ring", "8KiB", "--sndbuf", "4MiB", "--head", "56", "--mode", "splice"},
			options{conns: 1, total: 64 << 10, chunk: 4096, ring: 8192, sndbuf: 4 << 20, head: 56, mode: "splice", lock: true}, ""},
		{[]string{"--mode", "sendfile"}, options{}, `--mode "sendfile"`},
		{[]string{"--ring", "6MiB"}, options{}, "whole number"},
		{[]string{"--ring", "1MiB"}, options{}, "whole number"},
		{[]string{"--conns", "0"}, options{}, "--conns 0"},
		{[]string{"--total", "0"}, options{}, "--total must"},
		{[]string{"--total", "-1"}, options{}, "--total: size"},
		{[]string{"--chunk", "4TiB"}, options{}, "--chunk: size"},
		{[]string{"--total", "99999999999GiB"}, options{}, "too large"},
		{[]string{"--sndbuf", "2GiB"}, options{}, "past"},
		{[]string{"--head", "2000000"}, options{}, "--head"},
		{[]string{"--bogus"}, options{}, "flags:"},
		{[]string{"extra"}, options{}, "unexpected argument"},
	} {
		o, _, err := parseFlags(tc.args)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.err == "" && o != tc.want:
			t.Errorf("%q: %+v, want %+v", tc.args, o, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want one saying %q", tc.args, err, tc.err)
		}
	}
}

// near says whether a is b within rounding.
func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestSummarize(t *testing.T) {
	r := summarize(raw{sent: 4e9, received: 4e9, seconds: 0.5, sendCPU: 0.4, recvCPU: 0.6, procCPU: 1.2, hostCPU: 2, hostSoft: 0.5, mode: "splice", conns: 8})
	if !near(r.GBps, 8) || !near(r.SendPerGB, 0.1) || !near(r.RecvPerGB, 0.15) || !near(r.ProcPerGB, 0.3) || !near(r.HostPerGB, 0.5) || !near(r.PerCore, 4) {
		t.Errorf("figures %+v: want 8 GB/s, 0.1 and 0.15 s/GB, proc 0.3, host 0.5, 4 GB/s per core", r)
	}
	u := summarize(raw{received: 2e9, seconds: 1, sendCPU: -1, recvCPU: -1, procCPU: 0.5})
	if u.SendPerGB != -1 || u.RecvPerGB != -1 || !near(u.PerCore, 4) {
		t.Errorf("unlocked figures %+v: want -1 per side and 4 GB/s per core from the process's CPU", u)
	}
	z := summarize(raw{mode: "net"})
	if z.GBps != 0 || z.SendPerGB != -1 || z.PerCore != -1 {
		t.Errorf("an empty run gives %+v: want 0 GB/s and -1 for what was not measured", z)
	}
}

func TestParseHostStat(t *testing.T) {
	h, err := parseHostStat("cpu  100 20 300 5000 70 8 90 11 0 0\ncpu0 1 2 3\n")
	if err != nil || h.busy != 518 || h.softirq != 90 {
		t.Errorf("got %+v, %v: want busy 518 ticks, softirq 90", h, err)
	}
	// Differences are taken in ticks: in float seconds, 0.01 s of busy
	// time that was all softirq read as busy 0.00999999999476131 < softirq.
	before, _ := parseHostStat("cpu 1000000 0 0 0 0 0 123456789\n")
	after, _ := parseHostStat("cpu 1000000 0 0 0 0 0 123456790\n")
	if busy, soft := after.since(before); busy != soft || busy != 0.01 {
		t.Errorf("one softirq tick: busy %v s, softirq %v s: want 0.01 each", busy, soft)
	}
	if busy, _ := before.since(after); busy != 0 {
		t.Errorf("a counter going back gives %v s, want 0", busy)
	}
	for _, bad := range []string{"", "intr 1 2", "cpu 1 2 3", "cpu 1 2 3 4 5 6 x 8", "cpu 18446744073709551615 1 1 1 1 1 1"} {
		if _, err := parseHostStat(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestC builds tcpmodes.c with -Wall -Werror where gcc is installed and
// runs each of its modes with the same small figures: the same JSON keys
// as the Go probe, bytes and CPU as TestModes wants.
func TestC(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc: tcpmodes.c not built")
	}
	bin := filepath.Join(t.TempDir(), "tcpmodes")
	if out, err := exec.Command(gcc, "-O2", "-pthread", "-Wall", "-Wextra", "-Werror", "-o", bin, "tcpmodes.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	for _, mode := range []string{"write", "splice", "zerocopy"} {
		out, err := exec.Command(bin, "--conns", "2", "--total", "32MiB", "--chunk", "1MiB", "--ring", "4MiB", "--head", "56", "--mode", mode, "--json").Output()
		var ee *exec.ExitError
		if mode == "zerocopy" && errors.As(err, &ee) && bytes.Contains(ee.Stderr, []byte("SO_ZEROCOPY")) {
			t.Logf("zerocopy skipped: the kernel refuses SO_ZEROCOPY: %s", ee.Stderr)
			continue
		}
		if err != nil {
			if errors.As(err, &ee) {
				t.Fatalf("%s: %v: %s", mode, err, ee.Stderr)
			}
			t.Fatalf("%s: %v", mode, err)
		}
		checkResult(t, decodeStrict(t, out), "c", mode, 2, 32<<20, 1<<20)
	}
	out, err := exec.Command(bin, "--mode", "sendfile").CombinedOutput()
	if err == nil || !slices.Contains(strings.Fields(string(out)), "--mode") {
		t.Errorf("--mode sendfile: %v, %q: want a failure naming --mode", err, out)
	}
}
