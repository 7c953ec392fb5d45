package routing

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/stage-kv/stage/config"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeSession is a session as a route sees it, with no socket under it.
type fakeSession struct {
	node, remote string
	done         chan struct{}
	once         sync.Once
	mu           sync.Mutex
	err          error
}

func newSession(node, remote string) *fakeSession {
	return &fakeSession{node: node, remote: remote, done: make(chan struct{})}
}

func (f *fakeSession) Done() <-chan struct{}       { return f.done }
func (f *fakeSession) Peer() (node, remote string) { return f.node, f.remote }

func (f *fakeSession) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func (f *fakeSession) Close(err error) {
	f.once.Do(func() {
		f.mu.Lock()
		f.err = err
		f.mu.Unlock()
		close(f.done)
	})
}

// fakeHost dials with dial (nil: the dial waits until the peer leaves),
// refuses room with room, and counts dials by address.
type fakeHost struct {
	dial func(addr string) (*fakeSession, error)
	room error

	mu    sync.Mutex
	dials map[string]int
	busy  map[*fakeSession]int
}

func (h *fakeHost) Dial(ctx context.Context, _ *Route[*fakeSession], addr string) (*fakeSession, error) {
	h.mu.Lock()
	if h.dials == nil {
		h.dials = map[string]int{}
	}
	h.dials[addr]++
	h.mu.Unlock()
	if h.dial == nil {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return h.dial(addr)
}

func (h *fakeHost) Room(int) error { return h.room }

func (h *fakeHost) Busy(ss *fakeSession) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.busy[ss]
}

func (h *fakeHost) dialsOf(addr string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dials[addr]
}

// testTable is a table on h whose goroutines end with the test.
func testTable(t *testing.T, h *fakeHost) *Table[*fakeSession] {
	t.Helper()
	var wg sync.WaitGroup
	tab := New[*fakeSession](h, zap.NewNop(), &wg)
	ctx, cancel := context.WithCancel(context.Background())
	tab.mu.Lock()
	tab.ctx = ctx
	tab.mu.Unlock()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return tab
}

// testRoute is a route of rc that dials nothing by itself: tests place
// its peers (placePeer).
func testRoute(t *testing.T, h *fakeHost, rc config.Route) *Route[*fakeSession] {
	t.Helper()
	tab := testTable(t, h)
	if rc.ConnectTimeout == 0 {
		rc.ConnectTimeout = 5 * time.Second
	}
	return tab.newRoute(tab.ctx, rc)
}

// placed describes a peer a test puts on a route as it is.
type placed struct {
	addr, found, node string
	sess              *fakeSession
	draining, down    bool
	fails             uint64
}

func placePeer(r *Route[*fakeSession], pl placed) *peer[*fakeSession] {
	if pl.found == "" {
		pl.found = foundStatic
	}
	p := &peer[*fakeSession]{addr: pl.addr, found: pl.found, node: pl.node, sess: pl.sess, draining: pl.draining,
		down: pl.down, fails: pl.fails, kick: make(chan struct{}, 1)}
	if pl.sess != nil {
		_, p.remote = pl.sess.Peer()
	}
	if pl.down {
		p.lastErr = errors.New("connection refused")
	}
	p.ctx, p.cancel = context.WithCancel(r.ctx)
	p.lastUse.Store(time.Now().UnixNano())
	r.mu.Lock()
	r.peers[p.addr] = p
	r.mu.Unlock()
	return p
}
