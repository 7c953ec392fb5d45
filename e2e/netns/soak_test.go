package netns

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// sample is one sidecar's figures at one time.
type sample struct {
	at         time.Duration
	rss        uint64
	goroutines int
	fds        int
}

// sampler records the sidecars' RSS (/proc), goroutines and fds (their
// stats) every interval, printing each round.
type sampler struct {
	t    *testing.T
	scs  []*sidecar
	mu   sync.Mutex
	rows [][]sample // per sidecar
}

func (s *sampler) take(at time.Duration) error {
	line := fmt.Sprintf("%8v", at.Round(time.Second))
	for i, sc := range s.scs {
		st, err := sc.cl.Stats(context.Background())
		if err != nil {
			return fmt.Errorf("%s stats: %w", sc.name, err)
		}
		m, err := procStatus(sc.pid())
		if err != nil {
			return err
		}
		x := sample{at: at, rss: m["VmRSS"], goroutines: st.Goroutines, fds: procFDs(s.t, sc.pid())}
		s.mu.Lock()
		s.rows[i] = append(s.rows[i], x)
		s.mu.Unlock()
		line += fmt.Sprintf(" | %s rss %4d MiB, %3d goroutines, %3d fds", sc.name, x.rss>>20, x.goroutines, x.fds)
	}
	s.t.Log(line)
	return nil
}

// run samples every interval until ctx ends.
func (s *sampler) run(ctx context.Context, every time.Duration) error {
	start := time.Now()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := s.take(time.Since(start)); err != nil {
			return err
		}
	}
}

// median of f over rows[from:to].
func median(rows []sample, f func(sample) float64) float64 {
	var v []float64
	for _, r := range rows {
		v = append(v, f(r))
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// growth fails when the last quarter's medians exceed the second
// quarter's (after warm-up) by more than a margin: RSS 50% + 16 MiB,
// goroutines and fds +10.
func (s *sampler) growth() {
	s.t.Helper()
	for i, sc := range s.scs {
		rows := s.rows[i]
		if len(rows) < 8 {
			s.t.Errorf("%s: %d samples, too few to judge growth (raise DURATION)", sc.name, len(rows))
			continue
		}
		q := len(rows) / 4
		early, late := rows[q:2*q], rows[3*q:]
		for _, c := range []struct {
			what   string
			f      func(sample) float64
			margin func(float64) float64
		}{
			{"RSS (MiB)", func(x sample) float64 { return float64(x.rss >> 20) }, func(v float64) float64 { return 1.5*v + 16 }},
			{"goroutines", func(x sample) float64 { return float64(x.goroutines) }, func(v float64) float64 { return v + 10 }},
			{"fds", func(x sample) float64 { return float64(x.fds) }, func(v float64) float64 { return v + 10 }},
		} {
			e, l := median(early, c.f), median(late, c.f)
			s.t.Logf("%s %s: median %.0f early, %.0f late", sc.name, c.what, e, l)
			if l > c.margin(e) {
				s.t.Errorf("%s: %s grew from %.0f to %.0f over the soak", sc.name, c.what, e, l)
			}
		}
	}
}

// TestSoak: STAGE_SOAK_DURATION (e.g. 30m; `make soak DURATION=30m`) of
// mixed pushes both ways, each through a toxiproxy whose faults are
// toggled at random (resets, timeouts, bandwidth limits, latency
// spikes, blackholes of one stream). Every transfer is verified; the
// sidecars' RSS, goroutines and fds are sampled all along and must not
// grow, and both sidecars end idle.
func TestSoak(t *testing.T) {
	d := os.Getenv("STAGE_SOAK_DURATION")
	if d == "" {
		t.Skip("skipped: set STAGE_SOAK_DURATION (make soak DURATION=30m)")
	}
	dur, err := time.ParseDuration(d)
	if err != nil || dur < 40*time.Second {
		t.Fatalf("STAGE_SOAK_DURATION=%q: want a duration of 40s or more", d)
	}
	l := inLab(t, 2)
	if l == nil {
		return
	}
	// Each sidecar routes to the other through a proxy of its own.
	ab := newToxi(t, "a-b", l.HubIP+":0", l.addr(1))
	ba := newToxi(t, "b-a", l.HubIP+":0", l.addr(0))
	a := startSidecar(t, l, 0, spec{name: "a", routes: []route{{name: "b", peer: ab.addr(), progress: 10 * time.Second}}})
	b := startSidecar(t, l, 1, spec{name: "b", routes: []route{{name: "a", peer: ba.addr(), progress: 10 * time.Second}}})
	a.waitSessions(2, 15*time.Second)
	b.waitSessions(2, 15*time.Second)
	big := newPushes(t, "big", a, b, "b", 3, 4<<20)
	small := newPushes(t, "small", b, a, "a", 3, 256<<10)
	aBase, bBase := a.baseline(), b.baseline() // after the regions are registered: each keeps an fd
	small.block = 4 << 10
	s := &sampler{t: t, scs: []*sidecar{a, b}, rows: make([][]sample, 2)}
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	fa, fb := newFaults(t, ab, a.ns), newFaults(t, ba, b.ns)
	errs := make(chan error, 5)
	var wg sync.WaitGroup
	for _, fn := range []func() error{
		func() error { return fa.random(ctx, rand.New(rand.NewPCG(r.Uint64(), 2))) },
		func() error { return fb.random(ctx, rand.New(rand.NewPCG(r.Uint64(), 3))) },
		func() error { return s.run(ctx, max(dur/40, time.Second)) },
		func() error { return soakErr(big.run(ctx, 1<<30)) },
		func() error { return soakErr(small.run(ctx, 1<<30)) },
	} {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- fn() }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	big.check()
	small.check()
	t.Logf("faults a->b: %s; b->a: %s (toxiproxy replaced after a hang: %d)", fa.summary(), fb.summary(), ab.replacements()+ba.replacements())
	s.growth()
	a.waitSessions(2, 20*time.Second)
	b.waitSessions(2, 20*time.Second)
	a.checkIdle(aBase)
	b.checkIdle(bBase)
}

// soakErr: the soak's end (its deadline) is no error.
func soakErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}
