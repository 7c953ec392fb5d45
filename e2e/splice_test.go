package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// spliceEnv turns staging.splice_send on in a sidecar without the start-up
// probe (which picks writev on machines where splice is slower, the CI
// machine among them), writevEnv off.
var (
	spliceEnv = []string{"STAGE_STAGING_SPLICE_SEND=true", "STAGE_STAGING_SPLICE_PROBE=false"}
	writevEnv = []string{"STAGE_STAGING_SPLICE_SEND=false"}
)

const spliceOn = "splice send on"

// TestSpliceMoves: with splice send on both sidecars (so both push and
// pull send by splice), scattered and contiguous moves land byte-exact,
// with and without CRC32C, over more chunks than there are send slots, so
// slots are held, answered and reused many times. Nothing failed, so no
// slot was given fresh pages: every one was freed by its chunk's answer,
// also where the answer came before the writer's report. No slot,
// goroutine or fd is left at the end (pair's cleanup).
func TestSpliceMoves(t *testing.T) {
	m := "metrics:\n  listen: 127.0.0.1:0\n"
	pre, dec := pair(t, nodeOpts{stripes: 4, slots: 8, env: spliceEnv, decEnv: spliceEnv, extra: m, decExtra: m})
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
	for _, n := range []*node{pre, dec} {
		_, body := scrape(t, n.metrics, "/metrics")
		if v, ok := metricValue(body, "stage_send_slot_renewals_total"); !ok || v != 0 {
			t.Errorf("%s: stage_send_slot_renewals_total %v (reported: %v), want 0 after moves that all succeeded", n.name, v, ok)
		}
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
		if got := strings.Count(log, "splice_send does not apply here"); got != 1 || !strings.Contains(log, "security.tls") || strings.Contains(log, spliceOn) {
			t.Errorf("%s logged the TLS notice %d times (want 1), splice on: %v", n.name, got, strings.Contains(log, spliceOn))
		}
	}
}
