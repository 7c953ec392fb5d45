package netns

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stage-kv/stage/wire"
)

// newMoves makes newPushes or newPulls, as dir says.
func newMoves(t *testing.T, dir wire.Direction, name string, src, dst *sidecar, route string, layers int, layerBytes uint64) *pushes {
	t.Helper()
	if dir == wire.Pull {
		return newPulls(t, name, src, dst, route, layers, layerBytes)
	}
	return newPushes(t, name, src, dst, route, layers, layerBytes)
}

// killPeer SIGKILLs p's peer (dst) while transfer k is in flight: src's
// transfer must fail within progress, src must go back to base, and once
// dst is started again a verified transfer lands.
func killPeer(t *testing.T, p *pushes, progress time.Duration, base idle, k int) {
	t.Helper()
	done := inFlight(t, p, fmt.Sprintf("%s-peer-killed-%d", p.name, k))
	start := time.Now()
	p.dst.kill()
	failsWithin(t, done, start, progress, wire.CodePeerUnavailable, wire.CodeTimeout)
	p.src.checkIdle(base)
	restartAndLand(t, p, base, k)
}

// killSubmitter SIGKILLs p's src (whose engine submitted the transfer)
// while transfer k is in flight. The peer (dst) must tell its engine the
// transfer failed, never that it landed, and go back to base; once src
// is started again (its cache registered anew) a verified transfer lands.
func killSubmitter(t *testing.T, p *pushes, progress time.Duration, base idle, k int) {
	t.Helper()
	tag := fmt.Sprintf("%s-submitter-killed-%d", p.name, k)
	done := inFlight(t, p, tag)
	p.src.kill()
	select {
	case <-done: // the engine's connection died with its sidecar
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the engine's call did not return 10s after its sidecar was killed", tag)
	}
	n, ok := p.book.wait(tag, progress+5*time.Second)
	if !ok {
		t.Fatalf("%s: %s never told its engine what became of the transfer (%v after the kill)\n%s", tag, p.dst.name, progress+5*time.Second, p.dst.tail())
	}
	if n.Code == wire.CodeOK {
		t.Fatalf("%s: %s told its engine the transfer landed (%d B) although %s was killed mid-transfer", tag, p.dst.name, n.Bytes, p.src.name)
	}
	t.Logf("%s: %s notified %s: %s", tag, p.dst.name, n.Code, n.Message)
	p.dst.checkIdle(base)
	p.src.restart()
	p.attachSrc()
	p.src.waitSessions(1, 15*time.Second)
	if err := p.one(context.Background(), 0, k); err != nil {
		t.Fatalf("after %s restarted: %v", p.src.name, err)
	}
	p.dst.checkIdle(base)
}

// TestKillSender (trial a, the other side): the sender is SIGKILLed
// mid-push, STAGE_FAULT_TRIALS times (default 3). Each time the receiver
// notifies its engine of a failure (never of a landed push), goes back to
// idle (no slot, transfer, goroutine or fd left), and once the sender is
// started again a verified push lands.
func TestKillSender(t *testing.T) {
	l := inLab(t, 2)
	if l == nil {
		return
	}
	const progress = 5 * time.Second
	pre, dec := pair(t, l, slowDevice, progress, direct)
	p := newPushes(t, "killsend", pre, dec, "decode", 1, 32<<20)
	base := dec.baseline() // after the regions are registered: each keeps an fd
	trials := envInt(t, "STAGE_FAULT_TRIALS", 3)
	for k := 0; k < trials; k++ {
		killSubmitter(t, p, progress, base, k)
	}
	p.check()
	t.Logf("%d sender kills: the receiver reported each push failed, nothing leaked, the next push landed", trials)
}

// TestKillPull: TestKillReceiver and TestKillSender for pulls, alternating
// over STAGE_FAULT_TRIALS trials (default 2): the peer serving the pull is
// killed (even trials: the requester's pull fails within the progress
// deadline, the requester goes idle, a pull lands once the peer is back),
// or the requester is (odd trials: the serving peer notifies a failure,
// goes idle, and a pull lands once the requester is back).
func TestKillPull(t *testing.T) {
	l := inLab(t, 2)
	if l == nil {
		return
	}
	const progress = 5 * time.Second
	pre, dec := pair(t, l, slowDevice, progress, direct)
	p := newPulls(t, "killpull", pre, dec, "decode", 1, 32<<20)
	preBase, decBase := pre.baseline(), dec.baseline() // after the regions are registered: each keeps an fd
	trials := envInt(t, "STAGE_FAULT_TRIALS", 2)
	for k := 0; k < trials; k++ {
		if k%2 == 0 {
			killPeer(t, p, progress, preBase, k)
			decBase = dec.baseline() // a new process
		} else {
			killSubmitter(t, p, progress, decBase, k)
			preBase = pre.baseline()
		}
	}
	p.check()
	t.Logf("%d kills of a pull's ends (%d of the serving peer): each failed in time, nothing leaked, the next pull landed", trials, (trials+1)/2)
}

// TestHalfOpenPull is TestHalfOpen for a pull: the serving peer's
// namespace goes silent, then the peer is killed.
func TestHalfOpenPull(t *testing.T) { halfOpen(t, wire.Pull) }

// TestStopPeerPull is TestStopPeer for a pull: the serving peer, or the
// requester, is stopped for 8s mid-pull; the serving peer for 2s.
func TestStopPeerPull(t *testing.T) { stopPeer(t, wire.Pull) }
