package e2e

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// TestStoppedPeer: the receiver is SIGSTOPped mid-push. Its sockets stay
// open, so only the missing heartbeats tell: the sender fails the transfer
// within seconds, saying the peer went silent, not at the progress
// deadline. After SIGCONT the route redials and a new push succeeds.
func TestStoppedPeer(t *testing.T) {
	slow := "device:\n  hostmem:\n    bandwidth_gbps: 0.05\n"
	pre, dec := pair(t, nodeOpts{slots: 8, decExtra: slow})
	S, D := caches(t, pre, dec, 1, 32<<20)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := pre.cl.Do(context.Background(), kvsim.Transfer("decode", wire.Push, "stopped", S, D, kvsim.Ranges(S, 1<<20)))
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := dec.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(9 * time.Second):
		_ = dec.cmd.Process.Signal(syscall.SIGCONT)
		t.Fatal("the push to a stopped peer did not fail within 9s")
	}
	el := time.Since(start)
	if err := dec.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if client.CodeOf(err) != wire.CodePeerUnavailable || !strings.Contains(err.Error(), "silent") {
		t.Fatalf("after %v: got %v, want peer unavailable, silent", el, err)
	}
	t.Logf("failed after %v: %v", el.Round(time.Millisecond), err)
	// The route comes back; a new push works.
	deadline := time.Now().Add(15 * time.Second)
	for {
		if err := D.Poison(guard); err != nil {
			t.Fatal(err)
		}
		_, err := pre.cl.Do(context.Background(), kvsim.Transfer("decode", wire.Push, "after", S, D, kvsim.Ranges(S, 1<<20)))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no push worked within 15s of SIGCONT: %v\n%s", err, pre.tail())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := kvsim.Verify(S, D, kvsim.Ranges(S, 1<<20), guard); err != nil {
		t.Fatal(err)
	}
}

// TestGracefulDrain: SIGTERM during a push lets it finish (within
// drain_timeout), refuses new submits meanwhile, and exits 0; with a short
// drain_timeout the push fails instead of being reported done.
func TestGracefulDrain(t *testing.T) {
	slow := "device:\n  hostmem:\n    bandwidth_gbps: 0.05\n"
	for _, tc := range []struct {
		name, drain string
		wantOK      bool
	}{
		{"finishes within the deadline", "drain_timeout: 20s\n", true},
		{"fails past the deadline", "drain_timeout: 100ms\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Not pair(): the prefill sidecar exits during the test, so no
			// idle check can run on it afterwards.
			dec := startNode(t, "decode", nodeOpts{slots: 8, extra: slow})
			pre := startNode(t, "prefill", nodeOpts{slots: 8, route: "decode", peer: dec.peers, extra: tc.drain})
			pre.settle(1)
			S, D := caches(t, pre, dec, 1, 32<<20)
			cl := pre.cl
			done := make(chan error, 1)
			go func() {
				_, err := cl.Do(context.Background(), kvsim.Transfer("decode", wire.Push, "draining", S, D, kvsim.Ranges(S, 1<<20)))
				done <- err
			}()
			time.Sleep(150 * time.Millisecond)
			if err := pre.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			_, err := cl.Submit(context.Background(), kvsim.Transfer("decode", wire.Push, "late", S, D, kvsim.Ranges(S, 1<<20)))
			if c := client.CodeOf(err); c != wire.CodeShutdown && !errors.Is(err, client.ErrClosed) {
				t.Errorf("submit while draining: got %v, want shutting down", err)
			}
			err = <-done
			if tc.wantOK {
				if err != nil {
					t.Fatalf("push in flight at SIGTERM: %v", err)
				}
				if err := kvsim.Verify(S, D, kvsim.Ranges(S, 1<<20), guard); err != nil {
					t.Fatal(err)
				}
			} else if err == nil {
				t.Fatal("a push cut off by the drain deadline was reported done")
			}
			select {
			case <-pre.proc.Exited():
				if err := pre.proc.Err(); err != nil {
					t.Fatalf("staged exited with %v after SIGTERM\n%s", err, pre.tail())
				}
			case <-time.After(30 * time.Second):
				t.Fatal("staged did not exit after SIGTERM")
			}
		})
	}
}
