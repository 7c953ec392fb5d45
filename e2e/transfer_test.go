package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

const guard = 0xAB

// caches makes a source cache on one node and a destination cache on the
// other, each layer a region at a non-zero offset inside one allocation.
func caches(t *testing.T, src, dst *node, layers int, layerBytes uint64) (S, D *kvsim.Cache) {
	t.Helper()
	ctx := context.Background()
	var err error
	S, err = kvsim.New(src.name+"-kv", layers, layerBytes, 12288)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { S.Close() })
	D, err = kvsim.New(dst.name+"-kv", layers, layerBytes, 12288)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { D.Close() })
	if err := S.Fill(uint64(time.Now().UnixNano())); err != nil {
		t.Fatal(err)
	}
	if err := D.Poison(guard); err != nil {
		t.Fatal(err)
	}
	if err := S.Register(ctx, src.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	if err := D.Register(ctx, dst.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = S.Unregister(context.Background(), src.cl)
		_ = D.Unregister(context.Background(), dst.cl)
	})
	return S, D
}

// run submits one transfer per layer at once and waits for all of them.
func run(t *testing.T, cl *client.Client, dir wire.Direction, tag string, local, remote *kvsim.Cache, ms []kvsim.Move) {
	t.Helper()
	if _, err := kvsim.RunLayers(context.Background(), cl, "decode", dir, tag, local, remote, ms, 60*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestMoveGiB moves 1 GiB each way in both shapes, byte-exact, between
// regions that are views at non-zero offsets inside larger allocations.
func TestMoveGiB(t *testing.T) {
	size := uint64(1 << 30)
	if testing.Short() {
		size = 64 << 20
	}
	const layers = 4
	for _, tc := range []struct {
		name  string
		dir   wire.Direction
		moves func(c *kvsim.Cache) []kvsim.Move
	}{
		{"push ranges 1MiB", wire.Push, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Ranges(c, 1<<20) }},
		{"push blocks 16KiB", wire.Push, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Blocks(c, 16<<10, 11) }},
		{"pull ranges 1MiB", wire.Pull, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Ranges(c, 1<<20) }},
		{"pull blocks 16KiB", wire.Pull, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Blocks(c, 16<<10, 12) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pre, dec := pair(t, nodeOpts{stripes: 4, slots: 16})
			var S, D *kvsim.Cache
			if tc.dir == wire.Push {
				S, D = caches(t, pre, dec, layers, size/layers)
			} else {
				S, D = caches(t, dec, pre, layers, size/layers)
			}
			ms := tc.moves(S)
			start := time.Now()
			if tc.dir == wire.Push {
				run(t, pre.cl, wire.Push, "t", S, D, ms)
			} else {
				run(t, pre.cl, wire.Pull, "t", D, S, ms)
			}
			el := time.Since(start)
			if err := kvsim.Verify(S, D, ms, guard); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d MiB in %v (%.2f GB/s)", tc.name, size>>20, el.Round(time.Millisecond), float64(size)/el.Seconds()/1e9)
		})
	}
}

// TestNotifyAfterLanded: the receiving engine hears of every push, with the
// sender's tag, and only once every byte of it is in its memory.
func TestNotifyAfterLanded(t *testing.T) {
	pre, dec := pair(t, nodeOpts{stripes: 2, slots: 8})
	S, D := caches(t, pre, dec, 4, 8<<20)
	notes, err := dec.cl.Subscribe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ms := kvsim.Blocks(S, 16<<10, 5)
	byLayer := kvsim.ByLayer(S, ms)
	ctx := context.Background()
	for l, lm := range byLayer {
		if _, err := pre.cl.Submit(ctx, kvsim.Transfer("decode", wire.Push, fmt.Sprintf("request-%d", l), S, D, lm)); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	for len(seen) < len(byLayer) {
		select {
		case n := <-notes:
			if n.Code != wire.CodeOK {
				t.Fatalf("notification for %q failed: %s", n.Tag, n.Message)
			}
			var l int
			if _, err := fmt.Sscanf(n.Tag, "request-%d", &l); err != nil {
				t.Fatalf("notification with tag %q", n.Tag)
			}
			// Every byte of this layer must be in place already.
			if err := kvsim.Verify(S, D, byLayer[l], guard); err != nil {
				t.Fatalf("notified of %q before it landed: %v", n.Tag, err)
			}
			if n.Peer != "prefill" || n.Dir != wire.Push || n.Bytes != kvsim.Bytes(byLayer[l]) {
				t.Errorf("notification %+v: want peer prefill, push, %d B", n, kvsim.Bytes(byLayer[l]))
			}
			if seen[n.Tag] {
				t.Errorf("notified twice of %q", n.Tag)
			}
			seen[n.Tag] = true
		case <-time.After(30 * time.Second):
			t.Fatalf("got %d of %d notifications", len(seen), len(byLayer))
		}
	}
}
