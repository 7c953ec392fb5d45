package scenarios_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// spliceOn is what a sidecar logs when it sends by splice.
const spliceOn = "splice send on"

// splice turns staging.splice_send on or off in every sidecar; on, without
// the start-up probe (which picks writev on machines where splice is
// slower, the CI machine among them).
func splice(on bool) func(string, *config.Config) {
	return func(_ string, c *config.Config) {
		c.Staging.SpliceSend, c.Staging.SpliceProbe = on, false
	}
}

// TestSpliceMoves: with splice send on both sidecars (so both push and
// pull send by splice), scattered and contiguous moves land byte-exact,
// with and without CRC32C, over more chunks than there are send slots, so
// slots are held, answered and reused many times. Nothing failed, so no
// slot was given fresh pages: every one was freed by its chunk's answer,
// also where the answer came before the writer's report. No slot or
// transfer is left at the end, no goroutine or fd (Pair's checks).
func TestSpliceMoves(t *testing.T) {
	o := peerOpts()
	o.Stripes, o.Metrics, o.Configure = 4, true, splice(true)
	pre, dec := proxytest.Pair(t, o)
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
			tr := kvsim.Transfer(route, tc.dir, tc.name, S, D, ms)
			if tc.dir == wire.Pull {
				tr = kvsim.Transfer(route, tc.dir, tc.name, D, S, ms)
			}
			if tc.checksum {
				tr.Checksum = wire.ChecksumOn
			}
			if _, err := pre.Client.Do(context.Background(), tr); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if err := kvsim.Verify(S, D, ms, guard); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, sc := range []*proxytest.Sidecar{pre, dec} {
		_, body := scrape(t, sc, "/metrics")
		if v, ok := metricValue(body, "stage_send_slot_renewals_total"); !ok || v != 0 {
			t.Errorf("%s: stage_send_slot_renewals_total %v (reported: %v), want 0 after moves that all succeeded", sc.Name, v, ok)
		}
	}
}

// TestSpliceIgnoredWithTLS: with TLS there is nothing to splice; both
// sidecars say so once and push with writev, byte-exact.
func TestSpliceIgnoredWithTLS(t *testing.T) {
	y := testPKI(t)
	o := peerOpts()
	o.Configure = splice(true)
	pre, dec := proxytest.Pair(t, withTLS(o, map[string]config.TLS{"prefill": y.of("prefill"), "decode": y.of("decode")}))
	S, D := caches(t, pre, dec, 1, 8<<20)
	ms := kvsim.Ranges(S, 1<<20)
	run(t, pre.Client, wire.Push, "tls-splice", S, D, ms)
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
	for _, sc := range []*proxytest.Sidecar{pre, dec} {
		log := sc.LogText()
		if got := strings.Count(log, "splice_send does not apply here"); got != 1 || !strings.Contains(log, "security.tls") || strings.Contains(log, spliceOn) {
			t.Errorf("%s logged the TLS notice %d times (want 1), splice on: %v", sc.Name, got, strings.Contains(log, spliceOn))
		}
	}
}
