package netns

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stage-kv/stage/wire"
)

// relay forwards TCP connections to upstream and can stop reading what
// the dialer sends on data streams (told apart by their first frame,
// DataHello), as a receiver whose device hangs does: the sender's writes
// block on a full window while its control session carries on.
type relay struct {
	ln       net.Listener
	upstream string
	wg       sync.WaitGroup

	mu     sync.Mutex
	thaw   chan struct{}     // not nil while frozen; closed on thawing
	conns  map[net.Conn]bool // dialer side -> is a data stream
	closed bool
}

// newRelay listens on listen (host:0 picks a port) until the test ends.
func newRelay(t *testing.T, listen, upstream string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatalf("relay: %v", err)
	}
	r := &relay{ln: ln, upstream: upstream, conns: map[net.Conn]bool{}}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.close)
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go r.serve(c)
	}
}

// track remembers c (the dialer's side) for cutData and close; false
// once closed.
func (r *relay) track(c net.Conn, data bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conns[c] = data
	return !r.closed
}

func (r *relay) untrack(c net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.conns, c)
}

// cutData closes every data stream, leaving control sessions alone.
func (r *relay) cutData() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for c, data := range r.conns {
		if data {
			_ = c.Close()
			n++
		}
	}
	return n
}

func (r *relay) serve(c net.Conn) {
	defer r.wg.Done()
	u, err := net.Dial("tcp", r.upstream)
	if err != nil {
		_ = c.Close()
		return
	}
	defer func() { _ = c.Close(); _ = u.Close() }()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var head [4]byte // magic, version, type
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if _, err := u.Write(head[:]); err != nil {
		return
	}
	data := wire.Type(head[3]) == wire.TypeDataHello
	if !r.track(c, data) {
		return
	}
	defer r.untrack(c)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		_, _ = io.Copy(c, u)
		_ = c.Close()
		_ = u.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		if data {
			r.waitThawed()
		}
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := u.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *relay) waitThawed() {
	r.mu.Lock()
	ch := r.thaw
	r.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// freeze stops reading the data streams; thaw resumes.
func (r *relay) freeze() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.thaw == nil {
		r.thaw = make(chan struct{})
	}
}

func (r *relay) unfreeze() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.thaw != nil {
		close(r.thaw)
		r.thaw = nil
	}
}

func (r *relay) close() {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		_ = c.Close()
	}
	r.conns = map[net.Conn]bool{}
	r.mu.Unlock()
	r.unfreeze()
	_ = r.ln.Close() // ends accept
	r.wg.Wait()
}

// TestReceiverStopsReading (trial d): the receiver stops reading its data
// streams (a relay in front of it stops reading them) while its control
// session stays alive. The push to it must fail by its progress deadline
// (or sooner: its stalled streams are dropped), never be reported done; after that, the sender's other route, to a
// healthy receiver, must land pushes (the failed push must not keep the
// send slots its blocked writes hold); once the receiver reads again, a
// push to it lands and every sidecar goes back to idle.
func TestReceiverStopsReading(t *testing.T) {
	l := inLab(t, 3)
	if l == nil {
		return
	}
	const progress = 3 * time.Second
	// Slots of 4 MiB, and the receiver grants more credits than the
	// sender has send slots (a valid config: staging.window may be up to
	// staging.slots): the stuck session can take every send slot,
	// whatever the kernel's socket buffers absorb.
	dec := startSidecar(t, l, 1, spec{name: "decode", slotSize: "4MiB", window: 16})
	other := startSidecar(t, l, 2, spec{name: "other", slotSize: "4MiB"})
	r := newRelay(t, l.HubIP+":0", dec.addr())
	pre := startSidecar(t, l, 0, spec{name: "prefill", slotSize: "4MiB", routes: []route{
		{name: "decode", peer: r.addr(), progress: progress},
		{name: "other", peer: other.addr(), progress: progress},
	}})
	pre.waitSessions(2, 15*time.Second)
	p := newPushes(t, "stuck", pre, dec, "decode", 1, 64<<20)
	q := newPushes(t, "healthy", pre, other, "other", 1, 4<<20)
	preBase, decBase := pre.baseline(), dec.baseline() // after the regions are registered: each keeps an fd
	q.attempts = 1
	ctx := context.Background()
	if err := p.one(ctx, 0, 0); err != nil {
		t.Fatal(err)
	}
	r.freeze()
	done := inFlight(t, p, "unread")
	// Either the sender's progress deadline fails it (timeout), or,
	// first, the stall watchdog (staging.stall_timeout, 2s) drops the
	// streams whose chunk stopped halfway, and the session with them
	// (peer unavailable).
	failsWithin(t, done, time.Now(), progress+3*time.Second, wire.CodeTimeout, wire.CodePeerUnavailable)
	st := pre.stats()
	t.Logf("as the push failed: sender send slots in use %d of %d", st.SendInUse, st.SendSlots)
	for deadline := time.Now().Add(5 * time.Second); st.SendInUse > 0; st = pre.stats() {
		if time.Now().After(deadline) {
			t.Errorf("5s after the push failed, the receiver still not reading: %d of %d send slots still in use", st.SendInUse, st.SendSlots)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := 0; i < 3; i++ {
		if err := q.one(ctx, 0, i); err != nil {
			t.Errorf("a push to the healthy receiver while the other does not read: %v", err)
			break
		}
	}
	r.unfreeze()
	if err := p.one(ctx, 0, 1); err != nil {
		t.Fatalf("after the receiver reads again: %v", err)
	}
	pre.checkIdle(preBase)
	dec.checkIdle(decBase)
	p.check()
	q.check()
}

// TestDataStreamsCut: every data stream of the session is cut (the relay
// closes them) while the control session stays up, once mid-push and once
// while idle. A push in flight may fail (peer unavailable), but the route
// must recover: the next pushes land.
func TestDataStreamsCut(t *testing.T) {
	l := inLab(t, 2)
	if l == nil {
		return
	}
	var r *relay
	pre, dec := pair(t, l, slowDevice, 5*time.Second, func(dec *sidecar) string {
		r = newRelay(t, l.HubIP+":0", dec.addr())
		return r.addr()
	})
	p := newPushes(t, "cut", pre, dec, "decode", 1, 32<<20)
	preBase := pre.baseline() // after the regions are registered: each keeps an fd
	p.attempts = 10
	ctx := context.Background()
	done := inFlight(t, p, "cut-mid-push")
	if n := r.cutData(); n == 0 {
		t.Fatal("the relay saw no data stream to cut")
	}
	if err := <-done; err != nil {
		t.Logf("the push in flight failed: %v", err)
	}
	if err := p.one(ctx, 0, 0); err != nil {
		t.Fatalf("after cutting the data streams mid-push: %v\n%s", err, pre.tail())
	}
	if n := r.cutData(); n == 0 {
		t.Fatal("the relay saw no data stream to cut")
	}
	time.Sleep(200 * time.Millisecond)
	if err := p.one(ctx, 0, 1); err != nil {
		t.Fatalf("after cutting the idle data streams: %v\n%s", err, pre.tail())
	}
	pre.checkIdle(preBase)
	p.check()
}
