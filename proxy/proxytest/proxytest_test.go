package proxytest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// gnet starts its worker pool's goroutines when its package initialises:
// they are there before any test and stay; every other goroutine must go.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreCurrent()) }

const (
	guardByte  = 0xAB
	layers     = 2
	layerBytes = 1 << 20
	guard      = 4096
)

// cache makes a kvsim cache registered with sc, freed and unregistered by
// the test's cleanups (before the sidecars close).
func cache(t *testing.T, sc *proxytest.Sidecar, name string, access wire.Access) *kvsim.Cache {
	t.Helper()
	c, err := kvsim.New(name, layers, layerBytes, guard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := c.Poison(guardByte); err != nil {
		t.Fatal(err)
	}
	if err := c.Register(context.Background(), sc.Client, access); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Unregister(context.Background(), sc.Client); err != nil {
			t.Error(err)
		}
	})
	return c
}

// do runs one transfer per layer and waits for each.
func do(ctx context.Context, cl *client.Client, dir wire.Direction, local, remote *kvsim.Cache, ms []kvsim.Move) error {
	for l, lm := range kvsim.ByLayer(local, ms) {
		st, err := cl.Do(ctx, kvsim.Transfer(proxytest.Route, dir, "t", local, remote, lm))
		if err != nil {
			return err
		}
		if st.State != wire.StateDone {
			return fmt.Errorf("layer %d: state %v, want done", l, st.State)
		}
	}
	return nil
}

// TestPushPull: two in-process sidecars push a cache across and pull it
// back, as ranges and as scattered blocks, byte-exact, with bytes counted
// on both links.
func TestPushPull(t *testing.T) {
	pre, dec := proxytest.Pair(t, proxytest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name  string
		moves func(c *kvsim.Cache) []kvsim.Move
	}{
		{"ranges 64KiB", func(c *kvsim.Cache) []kvsim.Move { return kvsim.Ranges(c, 64<<10) }},
		{"blocks 16KiB", func(c *kvsim.Cache) []kvsim.Move { return kvsim.Blocks(c, 16<<10, 5) }},
		{"blocks 4KiB", func(c *kvsim.Cache) []kvsim.Move { return kvsim.Blocks(c, 4<<10, 6) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			P := cache(t, pre, "p", wire.AccessLocalRead)
			D := cache(t, dec, "d", wire.AccessRemoteWrite|wire.AccessRemoteRead)
			B := cache(t, pre, "b", wire.AccessLocalWrite)
			if err := P.Fill(uint64(time.Now().UnixNano())); err != nil {
				t.Fatal(err)
			}
			ms := tc.moves(P)
			before := pre.Snapshot()
			if err := do(ctx, pre.Client, wire.Push, P, D, ms); err != nil {
				t.Fatalf("push: %v", err)
			}
			if err := kvsim.Verify(P, D, ms, guardByte); err != nil {
				t.Fatalf("after the push: %v", err)
			}
			back := make([]kvsim.Move, len(ms))
			for i, m := range ms {
				back[i] = kvsim.Move{Layer: m.Layer, SrcOff: m.DstOff, DstOff: m.SrcOff, Len: m.Len}
			}
			if err := do(ctx, pre.Client, wire.Pull, B, D, back); err != nil {
				t.Fatalf("pull: %v", err)
			}
			if err := kvsim.Verify(D, B, back, guardByte); err != nil {
				t.Fatalf("after the pull: %v", err)
			}
			out, in := linkBytes(before), linkBytes(pre.Snapshot())
			if moved := kvsim.Bytes(ms); in[0]-out[0] < moved || in[1]-out[1] < moved {
				t.Errorf("link counted %d B out and %d B in, want at least %d each way", in[0]-out[0], in[1]-out[1], moved)
			}
		})
	}
}

// linkBytes sums bytes out and in over a snapshot's links.
func linkBytes(st proxy.Stats) [2]uint64 {
	var s [2]uint64
	for _, l := range st.Links {
		s[0] += l.BytesOut
		s[1] += l.BytesIn
	}
	return s
}

// TestRefused: ops the receiving sidecar must refuse fail with their code
// and leave its memory as it was.
func TestRefused(t *testing.T) {
	pre, dec := proxytest.Pair(t, proxytest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	P := cache(t, pre, "p", wire.AccessLocalRead|wire.AccessLocalWrite)
	if err := P.Fill(7); err != nil {
		t.Fatal(err)
	}
	readOnly := cache(t, dec, "ro", wire.AccessRemoteRead)
	writeOnly := cache(t, dec, "wo", wire.AccessRemoteWrite)
	for _, tc := range []struct {
		name   string
		dir    wire.Direction
		remote *kvsim.Cache
		t      func() client.Transfer
		code   wire.Code
	}{
		{"push into a region peers may only read", wire.Push, readOnly, func() client.Transfer {
			return kvsim.Transfer(proxytest.Route, wire.Push, "ro", P, readOnly, kvsim.Ranges(P, 64<<10)[:1])
		}, wire.CodeAccessDenied},
		{"pull from a region peers may only write", wire.Pull, writeOnly, func() client.Transfer {
			return kvsim.Transfer(proxytest.Route, wire.Pull, "wo", P, writeOnly, kvsim.Ranges(P, 64<<10)[:1])
		}, wire.CodeAccessDenied},
		{"push past the end of the remote region", wire.Push, writeOnly, func() client.Transfer {
			tr := kvsim.Transfer(proxytest.Route, wire.Push, "oob", P, writeOnly, kvsim.Ranges(P, 64<<10)[:1])
			tr.Ops[0].RemoteOff = layerBytes - 4096
			return tr
		}, wire.CodeOutOfRange},
		{"push into an unknown region", wire.Push, writeOnly, func() client.Transfer {
			tr := kvsim.Transfer(proxytest.Route, wire.Push, "unknown", P, writeOnly, kvsim.Ranges(P, 64<<10)[:1])
			tr.RemoteNames = []string{"no-such-region"}
			return tr
		}, wire.CodeUnknownRegion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := pre.Client.Do(ctx, tc.t())
			if err == nil {
				t.Fatalf("the transfer was not refused: %+v", st)
			}
			if c := client.CodeOf(err); c != tc.code {
				t.Fatalf("refused with %v (%v), want %v", c, err, tc.code)
			}
			snap, err := tc.remote.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			for i, b := range snap {
				if b != guardByte {
					t.Fatalf("byte %d of %s is %#x after a refused op, want it untouched (%#x)", i, tc.remote.Name, b, guardByte)
				}
			}
		})
	}
}
