package proxy

import (
	"sync"
	"testing"
	"time"
)

func testSession(dialer bool) *session {
	ss := &session{dialer: dialer, in: map[uint64]*inXfer{}, gone: map[uint64]bool{}}
	ss.announce = sync.NewCond(&ss.mu)
	return ss
}

// A chunk that overtook its Announce waits for it; one of a refused or
// finished transfer, or of our own parity, does not.
func TestIncomingWaitsForAnnounce(t *testing.T) {
	ss := testSession(true) // we dialed: the peer's ids are even
	x := &inXfer{wireID: 4}
	got := make(chan *inXfer, 1)
	go func() { got <- ss.incoming(4) }()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("returned before the Announce arrived")
	default:
	}
	ss.mu.Lock()
	ss.in[4] = x
	ss.announce.Broadcast()
	ss.mu.Unlock()
	select {
	case g := <-got:
		if g != x {
			t.Fatalf("got %p, want the announced transfer %p", g, x)
		}
	case <-time.After(time.Second):
		t.Fatal("still waiting after the Announce arrived")
	}

	go func() { got <- ss.incoming(6) }()
	time.Sleep(20 * time.Millisecond)
	ss.mu.Lock()
	ss.buryLocked(6, false) // the Announce was refused
	ss.mu.Unlock()
	select {
	case g := <-got:
		if g != nil {
			t.Fatal("got a transfer for a refused Announce")
		}
	case <-time.After(time.Second):
		t.Fatal("still waiting after the Announce was refused")
	}

	start := time.Now()
	if g := ss.incoming(3); g != nil || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("our own parity: got %v after %v, want nil at once", g, time.Since(start))
	}
	start = time.Now()
	if g := ss.incoming(8); g != nil || time.Since(start) < announceWait {
		t.Fatalf("never announced: got %v after %v, want nil after %v", g, time.Since(start), announceWait)
	}
}

func TestBuryIsBounded(t *testing.T) {
	ss := testSession(false)
	ss.mu.Lock()
	for i := uint64(0); i < 3*maxGone; i++ {
		ss.buryLocked(i, false)
	}
	ss.mu.Unlock()
	if len(ss.gone) != maxGone || len(ss.goneRing) != maxGone {
		t.Fatalf("kept %d tombstones (%d in the ring), want %d", len(ss.gone), len(ss.goneRing), maxGone)
	}
	if _, ok := ss.gone[3*maxGone-1]; !ok {
		t.Fatal("the newest tombstone was dropped")
	}
}
