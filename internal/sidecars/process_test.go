package sidecars

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeStaged writes a shell script that stands in for staged: it runs
// body with the --config path in $2.
func fakeStaged(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "staged")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// onTerm, first in a script, makes SIGTERM a clean exit; serve then waits
// for it in short sleeps, so that the trap runs soon.
const (
	onTerm = `trap 'echo stopping >&2; exit 0' TERM`
	serve  = `while :; do sleep 0.05; done`
)

func TestStartReady(t *testing.T) {
	bin := fakeStaged(t, onTerm+`
test -f "$2" || exit 3
echo "starting with $2, token $STAGE_SECURITY_TOKEN, extra $3 $X" >&2
echo "some other line"
echo "staged ready peers=127.0.0.1:4000 socket=/tmp/s.sock metrics=127.0.0.1:9 pprof=127.0.0.1:8 future=1"
`+serve)
	p, err := Start(context.Background(), Options{Bin: bin, Dir: t.TempDir(), Name: "n1", Config: "node:\n  name: n1\n",
		Token: "tok", Env: []string{"X=env"}, Args: []string{"--flag"}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Peers != "127.0.0.1:4000" || p.Socket != "/tmp/s.sock" || p.Metrics != "127.0.0.1:9" || p.Pprof != "127.0.0.1:8" {
		t.Errorf("ready line parsed as peers %q socket %q metrics %q pprof %q", p.Peers, p.Socket, p.Metrics, p.Pprof)
	}
	if b, err := os.ReadFile(p.ConfigPath); err != nil || string(b) != "node:\n  name: n1\n" {
		t.Errorf("config file: %q, %v", b, err)
	}
	if err := p.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	want := "starting with " + p.ConfigPath + ", token tok, extra --flag env"
	if !p.LogHas(want) || !p.LogHas("stopping") {
		t.Errorf("log lacks %q or the stop:\n%s", want, p.Tail(10))
	}
	// A second Stop does not signal again and reports the same exit.
	if err := p.Stop(syscall.SIGTERM, time.Second); err != nil {
		t.Errorf("second stop: %v", err)
	}
}

// TestStartFails: each way a sidecar can fail to get ready or to stop is
// an error that says so and carries its log.
func TestStartFails(t *testing.T) {
	for _, tc := range []struct {
		name, body    string
		startErr      string // "" when Start succeeds
		stopTimeout   time.Duration
		stopErr       string
		exitedOnError bool
	}{
		{name: "exits before ready", body: "echo 'config broken' >&2; exit 2", startErr: "exited before it was ready (exit status 2)"},
		{name: "exits 0 before ready", body: "echo 'nothing to do' >&2; exit 0", startErr: "exit status 0"},
		{name: "never ready", body: onTerm + "; echo 'stuck' >&2; " + serve, startErr: "not ready after"},
		{name: "fails to stop", body: "trap 'echo bye >&2; exit 1' TERM; echo 'staged ready peers=a socket=b'; " + serve,
			stopTimeout: 5 * time.Second, stopErr: "exited with exit status 1"},
		{name: "ignores the signal", body: "trap '' TERM; echo 'staged ready peers=a socket=b'; " + serve,
			stopTimeout: 300 * time.Millisecond, stopErr: "did not exit within 300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Start(context.Background(), Options{Bin: fakeStaged(t, tc.body), Dir: t.TempDir(), Name: "n", ReadyTimeout: 500 * time.Millisecond})
			if tc.startErr != "" {
				if err == nil {
					_ = p.Stop(syscall.SIGKILL, time.Second)
					t.Fatal("Start succeeded")
				}
				if !strings.Contains(err.Error(), tc.startErr) || !strings.Contains(err.Error(), "its log:\n") {
					t.Fatalf("Start: %v, want %q and the log", err, tc.startErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			err = p.Stop(syscall.SIGTERM, tc.stopTimeout)
			if err == nil || !strings.Contains(err.Error(), tc.stopErr) {
				t.Fatalf("Stop: %v, want %q", err, tc.stopErr)
			}
			select {
			case <-p.Exited():
			default:
				t.Fatal("Stop returned with the process still running")
			}
		})
	}
}

func TestStartCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := Start(ctx, Options{Bin: fakeStaged(t, onTerm+"\n"+serve), Dir: t.TempDir(), Name: "n"})
	if err == nil || !strings.Contains(err.Error(), context.Canceled.Error()) {
		t.Fatalf("Start: %v, want it canceled", err)
	}
}
