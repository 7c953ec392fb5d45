package proxy

import (
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestPreauthBounds(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	type step struct {
		release bool
		addr    netip.Addr
		ok      bool
		reason  int
	}
	tests := []struct {
		name            string
		total, perAddr  int
		steps           []step
		refusedTotal    uint64
		refusedPerAddr  uint64
		finalInProgress int
	}{
		{"per address bound first", 4, 2, []step{{addr: a, ok: true}, {addr: a, ok: true}, {addr: a, reason: refusedPerAddr}, {addr: b, ok: true}},
			0, 1, 3},
		{"total bound", 3, 2, []step{{addr: a, ok: true}, {addr: b, ok: true}, {addr: c, ok: true}, {addr: c, reason: refusedTotal}, {addr: a, reason: refusedTotal}},
			2, 0, 3},
		{"a release gives the place back", 2, 1, []step{{addr: a, ok: true}, {addr: a, reason: refusedPerAddr},
			{release: true, addr: a}, {addr: a, ok: true}, {addr: b, ok: true}, {addr: c, reason: refusedTotal}},
			1, 1, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPreauth(tt.total, tt.perAddr, zap.NewNop())
			for i, st := range tt.steps {
				if st.release {
					p.release(st.addr)
					continue
				}
				reason, ok := p.admit(st.addr)
				if ok != st.ok || (!ok && reason != st.reason) {
					t.Fatalf("step %d (%v): got ok %v reason %d, want ok %v reason %d", i, st.addr, ok, reason, st.ok, st.reason)
				}
			}
			if got := p.refused[refusedTotal].Load(); got != tt.refusedTotal {
				t.Errorf("refused by the total: got %d, want %d", got, tt.refusedTotal)
			}
			if got := p.refused[refusedPerAddr].Load(); got != tt.refusedPerAddr {
				t.Errorf("refused per address: got %d, want %d", got, tt.refusedPerAddr)
			}
			if got := p.inProgress(); got != tt.finalInProgress {
				t.Errorf("in progress: got %d, want %d", got, tt.finalInProgress)
			}
		})
	}
}

// A burst of refusals writes preauthBurst lines; the rest are counted and
// summed up in one line.
func TestPreauthLogSampled(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	log := zap.New(core)
	p := newPreauth(1, 1, log)
	const n = 500
	for range n {
		p.log.Warn("refused peer connection", zap.String("remote", "10.0.0.1:1"))
	}
	// A second may turn during the loop on a slow machine: two bursts.
	written := logs.FilterMessage("refused peer connection").Len()
	if written < preauthBurst || written > 2*preauthBurst {
		t.Fatalf("%d refusals wrote %d lines, want %d (two bursts at most)", n, written, preauthBurst)
	}
	now := time.Now()
	p.summarize(now, log)
	p.summarize(now.Add(time.Second), log) // too soon for another
	sums := logs.FilterMessageSnippet("suppressed").All()
	if len(sums) != 1 {
		t.Fatalf("got %d summary lines, want 1", len(sums))
	}
	if got := sums[0].ContextMap()["suppressed"]; got != uint64(n-written) {
		t.Errorf("summary says %v suppressed, want %d", got, n-written)
	}
	p.summarize(now.Add(preauthSummaryEvery), log) // nothing dropped since: no line
	if got := logs.FilterMessageSnippet("suppressed").Len(); got != 1 {
		t.Errorf("got %d summary lines after a quiet period, want still 1", got)
	}
}
