package proxy

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stage-kv/stage/staging"
)

func testSession(dialer bool) *session {
	ss := &session{dialer: dialer, out: newAnswerTable()}
	ss.in = newInbound(ss, 16)
	return ss
}

// A chunk that overtook its Announce waits for it; one of a refused or
// finished transfer, or of our own parity, does not.
func TestIncomingWaitsForAnnounce(t *testing.T) {
	ss := testSession(true) // we dialed: the peer's ids are even
	x := &inXfer{wireID: 4, total: 8, dest: byteDest{}}
	got := make(chan *inXfer, 1)
	go func() { got <- ss.in.incoming(4) }()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("returned before the Announce arrived")
	default:
	}
	x.ss = ss
	if err := ss.in.open(x); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-got:
		if g != x {
			t.Fatalf("got %p, want the announced transfer %p", g, x)
		}
	case <-time.After(time.Second):
		t.Fatal("still waiting after the Announce arrived")
	}

	go func() { got <- ss.in.incoming(6) }()
	time.Sleep(20 * time.Millisecond)
	ss.in.recv(staging.RecvEvent{Kind: staging.RxRefused, Transfer: 6}, nil) // the Announce was refused
	select {
	case g := <-got:
		if g != nil {
			t.Fatal("got a transfer for a refused Announce")
		}
	case <-time.After(time.Second):
		t.Fatal("still waiting after the Announce was refused")
	}

	start := time.Now()
	if g := ss.in.incoming(3); g != nil || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("our own parity: got %v after %v, want nil at once", g, time.Since(start))
	}
	start = time.Now()
	if g := ss.in.incoming(8); g != nil || time.Since(start) < announceWait {
		t.Fatalf("never announced: got %v after %v, want nil after %v", g, time.Since(start), announceWait)
	}
}

// A data stream dialed for an index whose stream still reads, or for a
// closed session, is refused: the new connection is closed at once and the
// stream in place is left as it was.
func TestAttachRefused(t *testing.T) {
	for _, tt := range []struct {
		name   string
		closed bool
		old    bool // a live stream holds the index
	}{
		{"index still read by the old stream", false, true},
		{"session closed", true, false},
		{"session closed, index held", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ss := testSession(false)
			ss.streams.list = make([]*dataStream, 2)
			ss.streams.closed = tt.closed
			var old *dataStream
			if tt.old {
				old = &dataStream{ss: ss, idx: 1}
				ss.streams.list[1] = old
				ss.streams.attached = 1
			}
			ours, theirs := net.Pipe()
			defer theirs.Close()
			if ss.attach(1, ours, nil) {
				t.Fatal("attached over a live stream or to a closed session")
			}
			if ss.streams.list[1] != old || ss.streams.attached != btoi(tt.old) {
				t.Fatalf("stream in place %p (attached %d), want %p untouched", ss.streams.list[1], ss.streams.attached, old)
			}
			if old != nil && (old.dead.Load() || old.stopped) {
				t.Fatal("the live stream was stopped by a refused re-attach")
			}
			_ = theirs.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := theirs.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
				t.Fatalf("refused connection not closed: read gave %v", err)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
