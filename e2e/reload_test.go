package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

func routeNames(t *testing.T, n *node) map[string]string {
	t.Helper()
	rs, err := n.cl.Routes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, r := range rs {
		m[r.Name] = r.Peers[0].State
	}
	return m
}

func waitRoutes(t *testing.T, n *node, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := routeNames(t, n)
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("routes %v, want %v\n%s", got, want, n.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func rewrite(t *testing.T, n *node, text string) {
	t.Helper()
	// Like an editor: write a new file and rename it over the old one.
	tmp := n.config + ".new"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, n.config); err != nil {
		t.Fatal(err)
	}
}

// TestReloadRoutes edits the config under a running staged: a route is
// added while a transfer runs on another, an invalid edit is refused with
// its key path and changes nothing, the route is removed again, and SIGHUP
// reloads too. The transfer on the route that stayed completes.
func TestReloadRoutes(t *testing.T) {
	slow := "device:\n  hostmem:\n    bandwidth_gbps: 0.05\n"
	pre, dec := pair(t, nodeOpts{slots: 8, decExtra: slow})
	other := startNode(t, "other", nodeOpts{})
	S, D := caches(t, pre, dec, 1, 32<<20)
	waitRoutes(t, pre, map[string]string{"decode": "up"})

	// A push on "decode" takes about 0.7 s at 50 MB/s: edit while it runs.
	done := make(chan error, 1)
	go func() {
		_, err := pre.cl.Do(context.Background(), kvsim.Transfer("decode", wire.Push, "stays", S, D, kvsim.Ranges(S, 1<<20)))
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	withOther := pre.configText + fmt.Sprintf("  - name: other\n    peers: [%q]\n    stripes: 1\n", other.peers)
	rewrite(t, pre, withOther)
	waitRoutes(t, pre, map[string]string{"decode": "up", "other": "up"})

	// An invalid edit is refused; both routes stay.
	rewrite(t, pre, withOther+"  - name: broken\n    peers: [\"no-port\"]\n")
	time.Sleep(500 * time.Millisecond)
	waitRoutes(t, pre, map[string]string{"decode": "up", "other": "up"})
	if !strings.Contains(pre.tail(), "routes[2].peers[0]") {
		t.Errorf("the refused reload does not name the bad key in the log:\n%s", pre.tail())
	}

	if err := <-done; err != nil {
		t.Fatalf("transfer on the route that stayed: %v", err)
	}
	if err := kvsim.Verify(S, D, kvsim.Ranges(S, 1<<20), guard); err != nil {
		t.Fatal(err)
	}

	// The new route works.
	O, err := kvsim.New("other-kv", 1, 1<<20, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer O.Close()
	if err := O.Poison(guard); err != nil {
		t.Fatal(err)
	}
	if err := O.Register(context.Background(), other.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	defer O.Unregister(context.Background(), other.cl)
	src, err := kvsim.New("src-kv", 1, 1<<20, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := src.Fill(5); err != nil {
		t.Fatal(err)
	}
	if err := src.Register(context.Background(), pre.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	defer src.Unregister(context.Background(), pre.cl)
	ms := kvsim.Ranges(src, 1<<20)
	if _, err := pre.cl.Do(context.Background(), kvsim.Transfer("other", wire.Push, "new-route", src, O, ms)); err != nil {
		t.Fatal(err)
	}
	if err := kvsim.Verify(src, O, ms, guard); err != nil {
		t.Fatal(err)
	}

	// Removed again, by SIGHUP this time (written without a rename, so
	// the file watcher may see it too: either way the route goes).
	if err := os.WriteFile(pre.config, []byte(pre.configText), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pre.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, pre, map[string]string{"decode": "up"})
	_, err = pre.cl.Do(context.Background(), kvsim.Transfer("other", wire.Push, "gone", src, O, ms))
	if client.CodeOf(err) != wire.CodeUnknownRoute {
		t.Fatalf("push on the removed route: got %v, want unknown route", err)
	}
}
