package scenarios_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// TestMetricsMoveDuringTransfer scrapes /metrics while a push runs (the
// receiver's emulated device is slowed to 50 MB/s) and checks the figures
// move, the transfer is counted when done, health endpoints answer, and
// promlint finds nothing.
func TestMetricsMoveDuringTransfer(t *testing.T) {
	o := peerOpts()
	o.Metrics, o.Configure = true, slowDevice(0.05, "decode")
	pre, dec := proxytest.Pair(t, o)
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body := scrape(t, pre, p); code != 200 {
			t.Fatalf("%s: %d %q", p, code, body)
		}
	}
	S, D := caches(t, pre, dec, 1, 32<<20)
	done := make(chan error, 1)
	go func() {
		_, err := pre.Client.Do(context.Background(), kvsim.Transfer(route, wire.Push, "metrics", S, D, kvsim.Ranges(S, 1<<20)))
		done <- err
	}()
	series := `stage_bytes_total{direction="out",link="decode"}`
	var seen []float64
	deadline := time.Now().Add(20 * time.Second)
	for len(seen) < 3 && time.Now().Before(deadline) {
		_, body := scrape(t, pre, "/metrics")
		if v, ok := metricValue(body, series); ok && v > 0 && (len(seen) == 0 || v > seen[len(seen)-1]) && v < 32<<20 {
			seen = append(seen, v)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(seen) < 2 {
		t.Fatalf("%s did not rise during the transfer: %v", series, seen)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_, body := scrape(t, pre, "/metrics")
	for _, want := range []struct {
		series string
		min    float64
	}{
		{series, 32 << 20},
		{`stage_transfers_total{link="decode",result="ok"}`, 1},
		{`stage_transfer_duration_seconds_count{direction="push",result="ok"}`, 1},
		{`stage_sessions{link="decode"}`, 1},
		{`stage_staging_slots{pool="send"}`, 4},
	} {
		v, ok := metricValue(body, want.series)
		if !ok || v < want.min {
			t.Errorf("%s = %v (found %v), want >= %v", want.series, v, ok, want.min)
		}
	}
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// TestInboundMetricsBounded: a decode that three prefills dial exports one
// link for all of them (wire.InboundLink), not one per prefill, so its
// series do not grow with the peers; its stats still list each inbound
// peer by node name.
func TestInboundMetricsBounded(t *testing.T) {
	const n = 3
	proxytest.NoLeaks(t)
	o := peerOpts()
	o.Metrics = true
	dec := proxytest.Start(t, "decode", "", o)
	D := cacheOn(t, dec, "kv", 0)
	for i := range n {
		pre := proxytest.Start(t, fmt.Sprintf("prefill-%d", i), dec.PeerAddr(), peerOpts())
		if err := pre.WaitSessions(1, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		S := cacheOn(t, pre, "src", uint64(i)+1)
		off := uint64(i) * 4096
		ms := []kvsim.Move{{Layer: 0, SrcOff: off, DstOff: off, Len: 4096}}
		if _, err := pre.Client.Do(context.Background(), kvsim.Transfer(route, wire.Push, fmt.Sprintf("in-%d", i), S, D, ms)); err != nil {
			t.Fatal(err)
		}
	}
	if err := dec.WaitSessions(n, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// The pusher's Do returns on the decode's answer, which may come before
	// the decode has counted the transfer: wait for the count, then read.
	if err := metricReaches(dec, `stage_transfers_total{link="peer:*",result="ok"}`, n); err != nil {
		t.Fatal(err)
	}
	_, body := scrape(t, dec, "/metrics")
	links := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		if _, rest, ok := strings.Cut(line, `link="`); ok && !strings.HasPrefix(line, "#") {
			l, _, _ := strings.Cut(rest, `"`)
			links[l] = true
		}
	}
	if len(links) != 1 || !links[wire.InboundLink] {
		t.Fatalf("link labels on a decode with %d inbound peers: %v, want only %q", n, links, wire.InboundLink)
	}
	for _, want := range []struct {
		series string
		v      float64
	}{
		{`stage_sessions{link="peer:*"}`, n},
		{`stage_transfers_total{link="peer:*",result="ok"}`, n},
		{`stage_bytes_total{direction="in",link="peer:*"}`, n * 4096},
	} {
		if v, ok := metricValue(body, want.series); !ok || v != want.v {
			t.Errorf("%s = %v (found %v), want %v", want.series, v, ok, want.v)
		}
	}
	var nodes []string
	for _, p := range dec.Snapshot().Inbound {
		nodes = append(nodes, p.Node)
		if p.Addr == "" || p.StreamsUp != p.Stripes || p.Stripes == 0 {
			t.Errorf("inbound peer %+v: want its address and every stripe up", p)
		}
	}
	if got := strings.Join(nodes, ","); got != "prefill-0,prefill-1,prefill-2" {
		t.Errorf("stats list inbound peers %q, want prefill-0,prefill-1,prefill-2", got)
	}
}
