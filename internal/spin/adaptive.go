package spin

import (
	"fmt"
	"runtime"
	"slices"
	"time"
)

// MaxWindow is the longest an adaptive reader polls (Policy.Max under
// auto). Waking a sleeping thread on a virtual machine costs 50-200 us;
// below a gap of about 1 ms that wake-up is a large share of a message's
// latency (a 4 KiB push lands in 30-40 us), above it a tenth or less. And a
// reader polls up to its window once more after the last message of a
// stretch before it sleeps, so the cap is also the most CPU one idle
// stretch can cost: 1 ms of one core.
const MaxWindow = time.Millisecond

// Adaptive's rule, in numbers. The last historyLen waits are kept; the
// window is set from the second longest of them (rank 1 from the top):
// with 16 waits about the 94th percentile, so one stray long wait in 16
// does not widen the window and one stray short stretch does not narrow
// it, and two waits past the cap (traffic stopped twice, or work that
// slow) bring it back to the base. minHistory waits are needed before the
// window moves off the base: a pace is not seen in one or two gaps.
// margin (a quarter of the gap) covers the jitter of a steady pace
// (scheduling, the peer's own wake-ups: tens of microseconds at 300 us);
// polling past the gap costs nothing when the bytes come, since a poll
// stops at the first ones, and only once when they do not.
const (
	historyLen = 16
	minHistory = 4
	topRank    = 1 // 0 is the longest
)

// Policy is how a reader polls its socket before it sleeps in a read: for
// Base after each message, and where Max > Base for up to Max when the
// waits it saw show a steady pace longer than Base (Adaptive). The zero
// Policy never polls; Fixed(d) always polls for d.
type Policy struct {
	Base, Max time.Duration
}

// Fixed polls for d after each message, whatever the pace; 0 never polls.
func Fixed(d time.Duration) Policy { d = max(d, 0); return Policy{Base: d, Max: d} }

// Auto is the adaptive policy: Window, widened up to MaxWindow for a
// steady pace.
func Auto() Policy { return Policy{Base: Window, Max: MaxWindow} }

// DefaultPolicy is what readers use unless told otherwise: Auto on
// machines of MinCPUs or more, never polling below (PolicyFor).
func DefaultPolicy() Policy { return PolicyFor(runtime.NumCPU()) }

// PolicyFor is DefaultPolicy's rule for a machine of ncpu CPUs.
func PolicyFor(ncpu int) Policy {
	if ncpu < MinCPUs {
		return Policy{}
	}
	return Auto()
}

// Off reports whether the policy never polls.
func (p Policy) Off() bool { return p.Base <= 0 }

// Adaptive reports whether the window follows the pace.
func (p Policy) Adaptive() bool { return !p.Off() && p.Max > p.Base }

func (p Policy) String() string {
	switch {
	case p.Off():
		return "0s"
	case p.Adaptive():
		return fmt.Sprintf("adaptive %s..%s", p.Base, p.Max)
	}
	return p.Base.String()
}

// New is a reader's state under p: one per reader.
func (p Policy) New() Adaptive { return Adaptive{p: p, win: max(p.Base, 0)} }

// Adaptive is one reader's polling window. It keeps the waits the reader
// saw before data arrived (Observe: from when it started waiting, polling
// or asleep, to when the bytes came) and sets the next window from them
// (Next). It is pure (no clock, no I/O) and not safe for concurrent use:
// each reader owns one and only its goroutine touches it, so it needs no
// lock.
type Adaptive struct {
	p    Policy
	gaps [historyLen]time.Duration
	n    int           // waits recorded, up to historyLen
	next int           // where the next one goes
	win  time.Duration // Next's answer, set when a wait is recorded
}

// Policy is the policy a was made with.
func (a *Adaptive) Policy() Policy { return a.p }

// Waits are the waits a remembers, oldest first (for tests and
// debugging).
func (a *Adaptive) Waits() []time.Duration {
	out := make([]time.Duration, 0, a.n)
	for i := range a.n {
		out = append(out, a.gaps[(a.next-a.n+i+historyLen)%historyLen])
	}
	return out
}

// Observe records a wait of d that ended with data.
func (a *Adaptive) Observe(d time.Duration) {
	if !a.p.Adaptive() {
		return
	}
	a.gaps[a.next] = d
	a.next = (a.next + 1) % historyLen
	a.n = min(a.n+1, historyLen)
	a.win = a.window()
}

// Next is how long to poll before sleeping: the base, unless the recent
// waits show a pace between the base and the cap; then the second longest
// of them plus a quarter, at most the cap. A pace above the cap (idle
// stretches, or work slower than that) leaves the base. It is worked out
// when a wait is recorded, so a reader may ask before every read.
func (a *Adaptive) Next() time.Duration { return a.win }

func (a *Adaptive) window() time.Duration {
	if a.n < minHistory {
		return a.p.Base
	}
	var s [historyLen]time.Duration
	g := s[:a.n]
	copy(g, a.gaps[:a.n])
	slices.Sort(g)
	q := g[len(g)-1-topRank]
	if q <= a.p.Base || q > a.p.Max {
		return a.p.Base
	}
	return min(q+q/4, a.p.Max)
}

// WindowAfter is the window a reader under p reaches once it has seen
// waits, oldest first (a reader's Waits): how a test checks that a reader
// applied the rule to the waits it timed, whatever those were.
func (p Policy) WindowAfter(waits ...time.Duration) time.Duration {
	a := p.New()
	for _, w := range waits {
		a.Observe(w)
	}
	return a.Next()
}
