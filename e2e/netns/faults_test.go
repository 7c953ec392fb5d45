package netns

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// faults injects the faults of the toxic trials between a sender (in
// namespace ns) and the toxiproxy in front of its receiver, and counts
// them.
type faults struct {
	t  *testing.T
	x  *toxi
	ns string // the sender's namespace, where blackholes go

	mu    sync.Mutex
	count map[string]int
}

func newFaults(t *testing.T, x *toxi, senderNS string) *faults {
	return &faults{t: t, x: x, ns: senderNS, count: map[string]int{}}
}

func (f *faults) note(kind string) {
	f.mu.Lock()
	f.count[kind]++
	f.mu.Unlock()
}

// summary lists how many of each fault were injected.
func (f *faults) summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for k, n := range f.count {
		parts = append(parts, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func (f *faults) injected(kind string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count[kind]
}

// steady puts on the toxics that stay for the whole trial: latency with
// jitter both ways, and the sender's bytes sliced into small segments.
func (f *faults) steady() error {
	for _, tx := range []toxic{
		{Name: "lat-up", Type: "latency", Stream: "upstream", Attrs: map[string]int{"latency": 3, "jitter": 3}},
		{Name: "lat-down", Type: "latency", Stream: "downstream", Attrs: map[string]int{"latency": 3, "jitter": 3}},
		{Name: "slicer", Type: "slicer", Stream: "upstream", Attrs: map[string]int{"average_size": 1500, "size_variation": 1000, "delay": 0}},
	} {
		if err := f.x.add(tx); err != nil {
			return err
		}
	}
	f.note("latency+jitter")
	f.note("slicer")
	return nil
}

// pulse puts a toxic on for d, then takes it off.
func (f *faults) pulse(ctx context.Context, tx toxic, d time.Duration) error {
	if err := f.x.add(tx); err != nil {
		return err
	}
	f.note(tx.Type)
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	return f.x.remove(tx.Name)
}

// reset resets about a third of the connections (control sessions and
// data streams alike) on their next bytes.
func (f *faults) reset(ctx context.Context) error {
	return f.pulse(ctx, toxic{Name: "reset", Type: "reset_peer", Toxicity: 0.3, Attrs: map[string]int{"timeout": 0}}, 100*time.Millisecond)
}

// timeout stops the bytes of about a third of the connections and closes
// them after half a second.
func (f *faults) timeout(ctx context.Context) error {
	return f.pulse(ctx, toxic{Name: "timeout", Type: "timeout", Toxicity: 0.3, Attrs: map[string]int{"timeout": 500}}, 700*time.Millisecond)
}

// bandwidth limits every connection to 2 MB/s for d.
func (f *faults) bandwidth(ctx context.Context, d time.Duration) error {
	return f.pulse(ctx, toxic{Name: "bandwidth", Type: "bandwidth", Attrs: map[string]int{"rate": 2048}}, d)
}

// blackhole drops every segment of the sender's busiest connection (a
// data stream) for d, in the sender's namespace.
func (f *faults) blackhole(ctx context.Context, d time.Duration) error {
	cs, err := conns(f.ns, f.x.addr())
	if err != nil {
		return err
	}
	if len(cs) == 0 {
		return nil // between sessions: nothing to blackhole now
	}
	busiest := cs[0]
	for _, c := range cs[1:] {
		if c.bytesAcked > busiest.bytesAcked {
			busiest = c
		}
	}
	if err := dropPorts(f.ns, "blackhole", busiest.localPort); err != nil {
		return err
	}
	f.note("blackhole")
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	return lift(f.ns, "blackhole")
}

// schedule runs the toxic trial's faults until ctx ends: a reset burst
// every 1.5s, a timeout burst every 5s, 2s of bandwidth limit every 10s,
// and a 2s blackhole of one data stream 1s in and every 20s after. A
// blackhole that finds no data stream (the session is between a reset and
// its redial) is tried again at the next free tick, so that one lands
// however the resets fall.
func (f *faults) schedule(ctx context.Context) error {
	start := time.Now()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	due := false
	for k := 1; ; k++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if k == 2 || (time.Since(start) > 20*time.Second && k%40 == 2) {
			due = true
		}
		var err error
		switch {
		case k%3 == 0:
			err = f.reset(ctx)
		case k%10 == 1:
			err = f.timeout(ctx)
		case k%20 == 5:
			err = f.bandwidth(ctx, 2*time.Second)
		case due:
			before := f.injected("blackhole")
			err = f.blackhole(ctx, 2*time.Second)
			due = f.injected("blackhole") == before
		}
		if err != nil {
			return err
		}
	}
}

// random runs one fault at a time, picked at random, with random pauses,
// until ctx ends (the soak).
func (f *faults) random(ctx context.Context, r *rand.Rand) error {
	for ctx.Err() == nil {
		var err error
		switch r.IntN(5) {
		case 0:
			err = f.reset(ctx)
		case 1:
			err = f.timeout(ctx)
		case 2:
			err = f.bandwidth(ctx, time.Duration(500+r.IntN(2500))*time.Millisecond)
		case 3:
			err = f.blackhole(ctx, time.Duration(500+r.IntN(2000))*time.Millisecond)
		case 4:
			err = f.pulse(ctx, toxic{Name: "slow", Type: "latency", Stream: "downstream", Attrs: map[string]int{"latency": 50, "jitter": 50}},
				time.Duration(500+r.IntN(2500))*time.Millisecond)
		}
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(200+r.IntN(2000)) * time.Millisecond):
		}
	}
	return nil
}
