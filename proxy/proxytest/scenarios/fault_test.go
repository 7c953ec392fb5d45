package scenarios_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/internal/knobs"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// withKnobs sets the test fault switches k on the sidecar named name, as
// STAGE_TEST_* in its environment would (config.Load reads them into
// Config.Knobs; here they go in directly).
func withKnobs(name string, k knobs.Values) func(string, *config.Config) {
	return func(n string, c *config.Config) {
		if n == name {
			c.SetKnobs(k)
		}
	}
}

// TestDeviceCopyFails: the receiver's device fails a copy mid-transfer. The
// transfer fails on both sides with a device error instead of hanging or
// reporting success, and the next transfer on a fresh region works.
func TestDeviceCopyFails(t *testing.T) {
	o := e2eOpts()
	o.Slots = 8
	o.Configure = withKnobs("decode", knobs.Values{HostmemFail: true, HostmemFailAfter: 5})
	pre, dec := proxytest.Pair(t, o)
	S, D := caches(t, pre, dec, 1, 16<<20)
	notes, err := dec.Client.Subscribe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, err = pre.Client.Do(context.Background(), kvsim.Transfer(route, wire.Push, "doomed", S, D, kvsim.Ranges(S, 1<<20)))
	if err == nil {
		t.Fatal("transfer reported success although the receiver's device failed a copy")
	}
	if c := client.CodeOf(err); c != wire.CodeDevice {
		t.Errorf("got %v, want a device error", err)
	}
	select {
	case n := <-notes:
		if n.Tag != "doomed" || n.Code != wire.CodeDevice {
			t.Fatalf("receiver heard %+v, want doomed with a device error", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("receiver never heard of the failed transfer")
	}
	// The failed copy stream was replaced: the same route moves bytes again.
	if err := D.Poison(guard); err != nil {
		t.Fatal(err)
	}
	ms := kvsim.Ranges(S, 1<<20)
	run(t, pre.Client, wire.Push, "after-failure", S, D, ms)
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
}

// TestSameNodeFallback: with imports of peer handles failing on purpose, an
// ipc transfer falls back to TCP, still lands byte-exact, and the fallback
// shows in stats (per route, by reason) and in the metrics.
func TestSameNodeFallback(t *testing.T) {
	o := onNode(t, "ipc")
	o.Metrics = true
	o.Configure = func(_ string, c *config.Config) { c.SetKnobs(knobs.Values{FaultIPCImport: true}) }
	pre, dec := proxytest.Pair(t, o)
	S, D := caches(t, pre, dec, 4, 4<<20)
	ms := kvsim.Ranges(S, 1<<20)
	for _, tag := range []string{"f1", "f2"} { // the second goes straight to TCP
		run(t, pre.Client, wire.Push, tag, S, D, ms)
		if err := kvsim.Verify(S, D, ms, guard); err != nil {
			t.Fatal(err)
		}
	}
	l := link(t, pre, route)
	if l.Fallbacks["import_failed"] == 0 || l.XfersIPC != 0 || l.ChunksOut == 0 {
		t.Fatalf("link %s: fallbacks %v, %d ipc transfers, %d chunks out; want import_failed counted and TCP used", route, l.Fallbacks, l.XfersIPC, l.ChunksOut)
	}
	if n := strings.Count(pre.LogText(), "same-node path unavailable"); n != 1 {
		t.Fatalf("fallback logged %d times, want once per session\n%s", n, pre.LogText())
	}
	_, body := scrape(t, pre, "/metrics")
	if v, ok := metricValue(body, `stage_transport_fallbacks_total{reason="import_failed"}`); !ok || v < 1 {
		t.Fatalf("metric stage_transport_fallbacks_total{reason=import_failed}: got %v (present %v), want >= 1", v, ok)
	}
}
