package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// TestSameNodeIPCIdle: two sidecars of one node on emulated devices push
// over ipc, four layers at once, three times: byte-exact, no chunk over
// TCP, and both sidecars back to their idle figures afterwards (pair's
// check): the node connections go after node.idle_conn_timeout (2 s in
// the harness) and nothing else a direct copy used stays open.
func TestSameNodeIPCIdle(t *testing.T) {
	pre, dec := pair(t, nodeOpts{stripes: 2, slots: 16, slot: "1MiB", nodeDir: oneNode(t), transport: "ipc"})
	S, D := caches(t, pre, dec, 4, 8<<20)
	ms := kvsim.Ranges(S, 1<<20)
	for i := range 3 {
		if _, err := kvsim.RunLayers(context.Background(), pre.cl, "decode", wire.Push, "ipc", S, D, ms, 60*time.Second); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
	if l := link(t, pre, "decode"); l.XfersIPC != 12 || l.ChunksOut != 0 || len(l.Fallbacks) != 0 {
		t.Fatalf("link decode: %d ipc transfers, %d chunks over TCP, fallbacks %v; want 12 over ipc only", l.XfersIPC, l.ChunksOut, l.Fallbacks)
	}
}

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
