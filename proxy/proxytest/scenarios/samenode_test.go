package scenarios_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// onNode is oneNode with the route's transport.
func onNode(t *testing.T, transport string) proxytest.Options {
	o := oneNode(t)
	o.Transport = transport
	return o
}

// moveAndVerify runs one shape from pre to dec and checks every byte.
func moveAndVerify(t *testing.T, pre, dec *proxytest.Sidecar, dir wire.Direction, moves func(*kvsim.Cache) []kvsim.Move) {
	t.Helper()
	var S, D *kvsim.Cache
	if dir == wire.Push {
		S, D = caches(t, pre, dec, 4, 8<<20)
	} else {
		S, D = caches(t, dec, pre, 4, 8<<20)
	}
	ms := moves(S)
	if dir == wire.Push {
		run(t, pre.Client, wire.Push, "sn", S, D, ms)
	} else {
		run(t, pre.Client, wire.Pull, "sn", D, S, ms)
	}
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
}

// TestSameNodeIPC: two hostmem sidecars on one node move every shape
// through each other's mapped memory (no chunk crosses TCP), byte-exact.
func TestSameNodeIPC(t *testing.T) {
	for _, tc := range shapes {
		t.Run(tc.name, func(t *testing.T) {
			pre, dec := proxytest.Pair(t, onNode(t, "ipc"))
			moveAndVerify(t, pre, dec, tc.dir, tc.moves)
			l := link(t, pre, route)
			if l.XfersIPC == 0 || l.ChunksOut+l.ChunksIn != 0 || len(l.Fallbacks) != 0 {
				t.Fatalf("link decode: %d ipc transfers, %d+%d chunks over TCP, fallbacks %v; want ipc only", l.XfersIPC, l.ChunksOut, l.ChunksIn, l.Fallbacks)
			}
			if tc.dir == wire.Push {
				// The debug line that times a same-node push's steps.
				lines := pre.Logs.FilterMessage("same-node push").All()
				if len(lines) == 0 {
					t.Fatal("no \"same-node push\" debug line for an ipc push")
				}
				f := lines[0].ContextMap()
				for _, k := range []string{"prep", "sched", "conn", "dialed", "handles", "copy", "copy_setup", "copy_wait", "done", "bytes"} {
					if _, ok := f[k]; !ok {
						t.Errorf("same-node push line lacks %q: %v", k, f)
					}
				}
			}
		})
	}
}

// TestSameNodeAuto: transport auto picks ipc for two sidecars of one node
// with the same device kind, and stagectl routes says so.
func TestSameNodeAuto(t *testing.T) {
	o := oneNode(t)
	pre, dec := proxytest.Pair(t, o)
	checkModes(t, o.NodeDir)
	rs, err := pre.Client.Routes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || len(rs[0].Peers) != 1 || rs[0].Peers[0].Transport != "ipc" || !rs[0].Peers[0].SameHost {
		t.Fatalf("routes: got %+v, want one same-host peer on ipc", rs)
	}
	moveAndVerify(t, pre, dec, wire.Push, shapes[1].moves)
	if l := link(t, pre, route); l.XfersIPC == 0 {
		t.Fatalf("auto on one node: got %d ipc transfers, want some (link %+v)", l.XfersIPC, l)
	}
}

// TestSameNodeShm: transport shm moves pushes through the shared ring
// (payloads never on a socket), byte-exact; pulls fall back to TCP, counted.
func TestSameNodeShm(t *testing.T) {
	for _, tc := range shapes {
		t.Run(tc.name, func(t *testing.T) {
			pre, dec := proxytest.Pair(t, onNode(t, "shm"))
			moveAndVerify(t, pre, dec, tc.dir, tc.moves)
			l := link(t, pre, route)
			if tc.dir == wire.Push {
				if l.XfersShm == 0 || l.ChunksOut != 0 {
					t.Fatalf("link decode: %d shm transfers, %d chunks over TCP; want shm only (%+v)", l.XfersShm, l.ChunksOut, l)
				}
				return
			}
			if l.Fallbacks["shm_pull_unsupported"] == 0 || l.ChunksIn == 0 {
				t.Fatalf("pull over shm: fallbacks %v, %d chunks in; want a counted fallback to TCP", l.Fallbacks, l.ChunksIn)
			}
		})
	}
}

// TestSameNodeTCP: transport tcp keeps two sidecars of one node on TCP,
// with no fallback counted.
func TestSameNodeTCP(t *testing.T) {
	pre, dec := proxytest.Pair(t, onNode(t, "tcp"))
	moveAndVerify(t, pre, dec, wire.Push, shapes[1].moves)
	l := link(t, pre, route)
	if l.XfersIPC+l.XfersShm != 0 || len(l.Fallbacks) != 0 || l.ChunksOut == 0 {
		t.Fatalf("transport tcp: %d ipc, %d shm, fallbacks %v, %d chunks; want TCP only", l.XfersIPC, l.XfersShm, l.Fallbacks, l.ChunksOut)
	}
}

// TestSameNodeRevoke: unregistering a region whose handle the peer holds
// makes the peer close its mapping at once (the session stays up), and a
// new registration is imported afresh.
func TestSameNodeRevoke(t *testing.T) {
	pre, dec := proxytest.Pair(t, onNode(t, "ipc"))
	S, D := caches(t, pre, dec, 2, 1<<20)
	ms := kvsim.Ranges(S, 1<<20)
	run(t, pre.Client, wire.Push, "r1", S, D, ms)
	if got := pre.Snapshot().PeerMappings; got != 1 {
		t.Fatalf("after a push into one allocation: %d peer mappings, want 1 (imported once)", got)
	}
	if err := D.Unregister(context.Background(), dec.Client); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for pre.Snapshot().PeerMappings != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("peer mappings still %d 5s after the receiver unregistered its regions", pre.Snapshot().PeerMappings)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := D.Register(context.Background(), dec.Client, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	if err := D.Poison(guard); err != nil {
		t.Fatal(err)
	}
	run(t, pre.Client, wire.Push, "r2", S, D, ms)
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
	if l := link(t, pre, route); l.XfersIPC != 4 {
		t.Fatalf("got %d ipc transfers, want 4 (2 layers, twice)", l.XfersIPC)
	}
}

// checkModes: the node socket directory is 0700 and each socket in it 0600.
func checkModes(t *testing.T, dir string) {
	t.Helper()
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m := st.Mode().Perm(); m != 0o700 {
		t.Fatalf("node socket directory mode %#o, want 0700", m)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 2 {
		t.Fatalf("%d entries in the node socket directory, want 2 (one per sidecar)", len(ents))
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v, want a socket with 0600", e.Name(), fi.Mode())
		}
	}
}

// TestSameNodeRefused: an ipc push the receiver refuses (its Announce
// travels on the node socket, just before the handle request) fails at
// once with the receiver's reason, writes nothing, and leaves the session
// usable for the next push.
func TestSameNodeRefused(t *testing.T) {
	pre, dec := proxytest.Pair(t, onNode(t, "ipc"))
	ctx := context.Background()
	S, D := caches(t, pre, dec, 2, 1<<20)
	ro, err := kvsim.New("dec-ro", 1, 1<<20, 12288)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ro.Close() })
	if err := ro.Poison(guard); err != nil {
		t.Fatal(err)
	}
	if err := ro.Register(ctx, dec.Client, wire.AccessLocalRead|wire.AccessLocalWrite|wire.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ro.Unregister(context.Background(), dec.Client) })
	ms := kvsim.Ranges(S, 1<<20)[:1]
	for _, tc := range []struct {
		name string
		xfer func() client.Transfer
		want wire.Code
	}{
		{"unknown region", func() client.Transfer {
			tr := kvsim.Transfer(route, wire.Push, "unknown", S, D, ms)
			tr.RemoteNames = []string{"no-such-region"}
			return tr
		}, wire.CodeUnknownRegion},
		{"no remote write", func() client.Transfer { return kvsim.Transfer(route, wire.Push, "ro", S, ro, ms) }, wire.CodeAccessDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := pre.Client.Do(ctx, tc.xfer())
			if client.CodeOf(err) != tc.want {
				t.Fatalf("push: got %v (code %s), want code %s", err, client.CodeOf(err), tc.want)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("refusal took %s: the push waited out a deadline instead of hearing the Nack", el)
			}
			b, err := ro.ReadLayer(0)
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(b, []byte{guard}); n != len(b) {
				t.Fatalf("refused push wrote into the read-only region: %d of %d bytes changed", len(b)-n, len(b))
			}
		})
	}
	run(t, pre.Client, wire.Push, "after", S, D, kvsim.Ranges(S, 1<<20))
	if err := kvsim.Verify(S, D, kvsim.Ranges(S, 1<<20), guard); err != nil {
		t.Fatal(err)
	}
	if l := link(t, pre, route); l.XfersIPC == 0 {
		t.Fatalf("link decode: no ipc transfer after the refusals (%+v)", l)
	}
}
