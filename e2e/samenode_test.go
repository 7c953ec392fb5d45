package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// oneNode returns a node socket directory for sidecars that share a node.
func oneNode(t *testing.T) string {
	t.Helper()
	// Short: a Unix socket path has at most 107 bytes.
	dir, err := os.MkdirTemp("", "stn-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "n")
}

// link returns the stats of the named link.
func link(t *testing.T, n *node, name string) wire.LinkStats {
	t.Helper()
	for _, l := range n.stats().Links {
		if l.Name == name {
			return l
		}
	}
	t.Fatalf("%s has no link %q", n.name, name)
	return wire.LinkStats{}
}

// TestSameNodeFallback: with imports of peer handles failing on purpose, an
// ipc transfer falls back to TCP, still lands byte-exact, and the fallback
// shows in stats (per route, by reason) and in the metrics.
func TestSameNodeFallback(t *testing.T) {
	pre, dec := pair(t, nodeOpts{nodeDir: oneNode(t), transport: "ipc", env: []string{"STAGE_TEST_FAULT_IPC_IMPORT=1"},
		extra: "metrics:\n  listen: 127.0.0.1:0\n"})
	S, D := caches(t, pre, dec, 4, 4<<20)
	ms := kvsim.Ranges(S, 1<<20)
	for _, tag := range []string{"f1", "f2"} { // the second goes straight to TCP
		run(t, pre.cl, wire.Push, tag, S, D, ms)
		if err := kvsim.Verify(S, D, ms, guard); err != nil {
			t.Fatal(err)
		}
	}
	l := link(t, pre, "decode")
	if l.Fallbacks["import_failed"] == 0 || l.XfersIPC != 0 || l.ChunksOut == 0 {
		t.Fatalf("link decode: fallbacks %v, %d ipc transfers, %d chunks out; want import_failed counted and TCP used", l.Fallbacks, l.XfersIPC, l.ChunksOut)
	}
	logText, err := os.ReadFile(pre.log)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(logText), "same-node path unavailable"); n != 1 {
		t.Fatalf("fallback logged %d times, want once per session\n%s", n, pre.tail())
	}
	_, body := scrape(t, pre.metrics, "/metrics")
	if v, ok := metricValue(body, `stage_transport_fallbacks_total{reason="import_failed"}`); !ok || v < 1 {
		t.Fatalf("metric stage_transport_fallbacks_total{reason=import_failed}: got %v (present %v), want >= 1", v, ok)
	}
}
