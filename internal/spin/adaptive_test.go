package spin

import (
	"testing"
	"time"
)

const us = time.Microsecond

func rep(d time.Duration, n int) []time.Duration {
	g := make([]time.Duration, n)
	for i := range g {
		g[i] = d
	}
	return g
}

func cat(gs ...[]time.Duration) []time.Duration {
	var out []time.Duration
	for _, g := range gs {
		out = append(out, g...)
	}
	return out
}

// TestAdaptiveNext feeds waits to a reader's Adaptive and checks the
// window it then polls for.
func TestAdaptiveNext(t *testing.T) {
	auto := Auto()
	for _, tc := range []struct {
		name string
		p    Policy
		gaps []time.Duration
		want time.Duration
	}{
		{"nothing seen: the base", auto, nil, Window},
		{"too few waits to call a pace", auto, rep(300*us, minHistory-1), Window},
		{"steady 300us: covered with a quarter's margin", auto, rep(300*us, 20), 375 * us},
		{"steady 150us", auto, rep(150*us, 16), 187500 * time.Nanosecond},
		{"back to back, below the base: the base", auto, rep(20*us, 16), Window},
		{"alternating 20us and 200us: the longer", auto, cat(rep(20*us, 1), rep(200*us, 1), rep(20*us, 1), rep(200*us, 1), rep(20*us, 1), rep(200*us, 1)), 250 * us},
		{"one stray long wait does not widen it", auto, cat(rep(150*us, 15), rep(900*us, 1)), 187500 * time.Nanosecond},
		{"one stray short stretch does not narrow it", auto, cat(rep(300*us, 15), rep(10*us, 1)), 375 * us},
		{"900us: capped at Max", auto, rep(900*us, 16), MaxWindow},
		{"pace above the cap: the base", auto, rep(2*time.Millisecond, 16), Window},
		{"steady 300us then two idle gaps: back to the base", auto, cat(rep(300*us, 16), rep(time.Second, 2)), Window},
		{"steady 300us then one idle gap: still covered", auto, cat(rep(300*us, 16), rep(time.Second, 1)), 375 * us},
		{"idle long ago, steady since: covered", auto, cat(rep(time.Second, 8), rep(300*us, 16)), 375 * us},
		{"fixed 100us ignores the pace", Fixed(100 * us), rep(300*us, 16), 100 * us},
		{"fixed 0 never polls", Fixed(0), rep(300*us, 16), 0},
		{"off never polls", Policy{}, rep(300*us, 16), 0},
		{"custom base and cap", Policy{Base: 50 * us, Max: 200 * us}, rep(120*us, 16), 150 * us},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.p.New()
			for _, g := range tc.gaps {
				a.Observe(g)
			}
			if got := a.Next(); got != tc.want {
				t.Errorf("after %d waits: Next() = %s, want %s", len(tc.gaps), got, tc.want)
			}
		})
	}
}

// TestAdaptiveIdle: a reader at a steady 300 us pace polls long enough to
// cover it, never past the cap whatever it saw, and once the traffic stops
// (waits past the cap) polls only the base again: one idle stretch costs
// at most one window of at most MaxWindow.
func TestAdaptiveIdle(t *testing.T) {
	a := Auto().New()
	for range 64 {
		a.Observe(300 * us)
	}
	if w := a.Next(); w < 300*us || w > MaxWindow {
		t.Fatalf("steady 300us pace: window %s, want 300us..%s", w, MaxWindow)
	}
	for i := range 2 * historyLen {
		a.Observe(time.Duration(i+1) * time.Hour)
		if w := a.Next(); w > MaxWindow {
			t.Fatalf("after %d idle gaps: window %s, above the cap %s", i+1, w, MaxWindow)
		}
	}
	if w := a.Next(); w != Window {
		t.Fatalf("after idle gaps: window %s, want the base %s", w, Window)
	}
}

func TestPolicy(t *testing.T) {
	for _, tc := range []struct {
		p       Policy
		off, ad bool
		str     string
	}{
		{Policy{}, true, false, "0s"},
		{Fixed(0), true, false, "0s"},
		{Fixed(-time.Second), true, false, "0s"},
		{Fixed(100 * us), false, false, "100µs"},
		{Auto(), false, true, "adaptive 100µs..1ms"},
		{Policy{Base: 0, Max: time.Millisecond}, true, false, "0s"},
	} {
		if tc.p.Off() != tc.off || tc.p.Adaptive() != tc.ad || tc.p.String() != tc.str {
			t.Errorf("%+v: Off %v Adaptive %v String %q, want %v %v %q", tc.p, tc.p.Off(), tc.p.Adaptive(), tc.p.String(), tc.off, tc.ad, tc.str)
		}
	}
	for _, tc := range []struct {
		ncpu int
		want Policy
	}{{1, Policy{}}, {MinCPUs - 1, Policy{}}, {MinCPUs, Auto()}, {128, Auto()}} {
		if got := PolicyFor(tc.ncpu); got != tc.want {
			t.Errorf("PolicyFor(%d) = %s, want %s", tc.ncpu, got, tc.want)
		}
	}
}

func TestAdaptiveWaits(t *testing.T) {
	a := Auto().New()
	if w := a.Waits(); len(w) != 0 {
		t.Fatalf("fresh: %v", w)
	}
	for i := range historyLen + 3 {
		a.Observe(time.Duration(i))
	}
	w := a.Waits()
	if len(w) != historyLen || w[0] != 3 || w[historyLen-1] != historyLen+2 {
		t.Fatalf("after %d waits: %v, want 3..%d oldest first", historyLen+3, w, historyLen+2)
	}
	f := Fixed(Window).New()
	f.Observe(time.Second)
	if len(f.Waits()) != 0 {
		t.Fatal("a fixed window recorded a wait")
	}
}

// TestWindowAfter: replaying a reader's remembered waits gives the window
// the reader reached, also when it saw more waits than it remembers.
func TestWindowAfter(t *testing.T) {
	us := time.Microsecond
	a := Auto().New()
	for i := range 40 {
		a.Observe(time.Duration(200+10*i) * us) // the last 16: 440..590 us
	}
	if got, want := Auto().WindowAfter(a.Waits()...), a.Next(); got != want || want == Window {
		t.Fatalf("replayed window %s, the reader's %s (and not the base %s)", got, want, Window)
	}
	if got := Auto().WindowAfter(300*us, 300*us, 300*us); got != Window {
		t.Fatalf("three waits: %s, want the base (too few to see a pace)", got)
	}
	if got := Fixed(50*us).WindowAfter(300*us, 300*us, 300*us, 300*us); got != 50*us {
		t.Fatalf("a fixed window moved: %s", got)
	}
}
