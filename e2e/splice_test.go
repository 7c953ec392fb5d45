package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// spliceEnv turns staging.splice_send on in a sidecar.
var spliceEnv = []string{"STAGE_STAGING_SPLICE_SEND=true"}

const spliceOn = "splice send on"

// TestSpliceMoves: with splice send on both sidecars (so both push and
// pull send by splice), scattered and contiguous moves land byte-exact,
// with and without CRC32C, over more chunks than there are send slots, so
// slots are held, answered and reused many times. No slot, goroutine or
// fd is left at the end (pair's cleanup).
func TestSpliceMoves(t *testing.T) {
	pre, dec := pair(t, nodeOpts{stripes: 4, slots: 8, env: spliceEnv, decEnv: spliceEnv})
	waitLogged(t, pre, spliceOn)
	waitLogged(t, dec, spliceOn)
	for _, tc := range []struct {
		name     string
		dir      wire.Direction
		checksum bool
		moves    func(c *kvsim.Cache) []kvsim.Move
	}{
		{"push ranges", wire.Push, false, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Ranges(c, 1<<20) }},
		{"push blocks with crc", wire.Push, true, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Blocks(c, 16<<10, 5) }},
		{"pull blocks", wire.Pull, false, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Blocks(c, 16<<10, 6) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := pre, dec
			if tc.dir == wire.Pull {
				src, dst = dec, pre
			}
			S, D := caches(t, src, dst, 2, 24<<20)
			ms := tc.moves(S)
			tr := kvsim.Transfer("decode", tc.dir, tc.name, S, D, ms)
			if tc.dir == wire.Pull {
				tr = kvsim.Transfer("decode", tc.dir, tc.name, D, S, ms)
			}
			if tc.checksum {
				tr.Checksum = wire.ChecksumOn
			}
			if _, err := pre.cl.Do(context.Background(), tr); err != nil {
				t.Fatalf("%s: %v\n%s", tc.name, err, pre.tail())
			}
			if err := kvsim.Verify(S, D, ms, guard); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSpliceStreamRedial: two of four data streams are cut during a
// spliced push: the chunks held for them are given up, their slots get
// fresh pages and come back, the push completes byte-exact on the other
// streams, and a second push after the redials verifies too. Every send
// slot is home at the end (renewed ones included: pair-like cleanup).
func TestSpliceStreamRedial(t *testing.T) {
	slow := "device:\n  hostmem:\n    bandwidth_gbps: 0.2\n"
	dec := startNode(t, "decode", nodeOpts{slots: 16, extra: slow, env: spliceEnv})
	r := newRelay(t, dec.peers)
	pre := startNode(t, "prefill", nodeOpts{slots: 16, stripes: 4, route: "decode", peer: r.addr(), env: spliceEnv})
	pre.settle(1)
	dec.settle(1)
	t.Cleanup(func() {
		pre.checkIdle()
		dec.checkIdle()
	})
	waitLogged(t, pre, spliceOn)
	S, D := caches(t, pre, dec, 1, 48<<20)
	ms := kvsim.Ranges(S, 1<<20)
	done := make(chan error, 1)
	go func() {
		_, err := pre.cl.Do(context.Background(), kvsim.Transfer("decode", wire.Push, "cut", S, D, ms))
		done <- err
	}()
	time.Sleep(150 * time.Millisecond)
	for _, idx := range []uint16{1, 2} {
		if !r.cut(idx) {
			t.Fatalf("no data stream %d to cut", idx)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("spliced push with two streams cut: %v\n%s", err, pre.tail())
	}
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for pre.streamsUp() != 4 {
		if time.Now().After(deadline) {
			t.Fatalf("%d data streams up 10s after the cut, want 4\n%s", pre.streamsUp(), pre.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := D.Poison(guard); err != nil {
		t.Fatal(err)
	}
	run(t, pre.cl, wire.Push, "after-redial", S, D, ms)
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
}

// TestSpliceIgnoredWithTLS: with TLS there is nothing to splice; both
// sidecars say so once and push with writev, byte-exact.
func TestSpliceIgnoredWithTLS(t *testing.T) {
	y := testPKI(t)
	pre, dec := pair(t, nodeOpts{stripes: 2, slots: 8, extra: y.of("prefill"), decExtra: y.of("decode"), env: spliceEnv, decEnv: spliceEnv})
	S, D := caches(t, pre, dec, 1, 8<<20)
	ms := kvsim.Ranges(S, 1<<20)
	run(t, pre.cl, wire.Push, "tls-splice", S, D, ms)
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*node{pre, dec} {
		log := readLog(n)
		if got := strings.Count(log, "splice_send has no effect with security.tls"); got != 1 || strings.Contains(log, spliceOn) {
			t.Errorf("%s logged the TLS notice %d times (want 1), splice on: %v", n.name, got, strings.Contains(log, spliceOn))
		}
	}
}
