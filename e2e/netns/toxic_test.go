package netns

import (
	"context"
	"testing"
	"time"
)

// viaToxi starts a toxiproxy in the hub in front of the receiver and
// returns the address the sender's route dials.
func viaToxi(t *testing.T, l *lab, x **toxi) func(dec *sidecar) string {
	return func(dec *sidecar) string {
		*x = newToxi(t, "decode", l.HubIP+":0", dec.addr())
		return (*x).addr()
	}
}

// TestToxicPushes (trial c): STAGE_FAULT_TRANSFERS pushes (default 100;
// `make faults` runs 1000) of 4 MiB in 16 KiB blocks, four at a time,
// through toxiproxy with latency and jitter both ways and the sender's
// bytes sliced into small segments throughout, reset bursts, timeout
// bursts, bandwidth limits, and a 2s nftables blackhole of one data
// stream. Attempts may fail (peer unavailable, timeout) and are retried;
// every transfer must land exactly, be notified once by the receiver,
// and nothing reported done may be missing a byte.
func TestToxicPushes(t *testing.T) {
	l := inLab(t, 2)
	if l == nil {
		return
	}
	n := envInt(t, "STAGE_FAULT_TRANSFERS", 100)
	var x *toxi
	pre, dec := pair(t, l, "", 15*time.Second, viaToxi(t, l, &x))
	p := newPushes(t, "toxic", pre, dec, "decode", 4, 4<<20)
	preBase, decBase := pre.baseline(), dec.baseline() // after the regions are registered: each keeps an fd
	f := newFaults(t, x, pre.ns)
	if err := f.steady(); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	chaos := make(chan error, 1)
	go func() { chaos <- f.schedule(ctx) }()
	start := time.Now()
	err := p.run(context.Background(), n)
	// The faults follow a clock, the transfers do not: on a fast machine
	// the run may end before the blackhole and a reset burst came. Go on,
	// in small batches, until both have (or a minute has passed).
	for more := n; err == nil && (f.injected("blackhole") == 0 || f.injected("reset_peer") == 0) && time.Since(start) < time.Minute; more += 8 {
		err = p.runRange(context.Background(), more, more+8)
		n = more + 8
	}
	stop()
	if cerr := <-chaos; cerr != nil {
		t.Errorf("injecting faults: %v", cerr)
	}
	if err != nil {
		t.Fatalf("%v\nsender log:\n%s\nreceiver log:\n%s", err, pre.tail(), dec.tail())
	}
	p.check()
	t.Logf("%d transfers in %v under faults: %s (toxiproxy replaced after a hang: %d)", n, time.Since(start).Round(time.Millisecond), f.summary(), x.replacements())
	if f.injected("blackhole") == 0 || f.injected("reset_peer") == 0 {
		t.Errorf("the run ended before the blackhole and a reset burst were injected (%s): raise STAGE_FAULT_TRANSFERS", f.summary())
	}
	for _, name := range []string{"lat-up", "lat-down", "slicer"} {
		if err := x.remove(name); err != nil {
			t.Error(err)
		}
	}
	pre.waitSessions(1, 15*time.Second)
	pre.checkIdle(preBase)
	dec.checkIdle(decBase)
}
