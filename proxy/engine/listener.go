package engine

import (
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// Options are the control socket's limits.
type Options struct {
	MaxClients int         // connections at once, admitted or not; one more is refused at once
	ReadSpin   spin.Policy // how long a reader polls before it sleeps in a read
	// FirstRequestTimeout: a connection that sent nothing this long after
	// it connected is refused (admit.go); 0: never.
	FirstRequestTimeout time.Duration
	// TrustSocketParent: security.trust_socket_parent (unixsock.MakeDir).
	TrustSocketParent bool
}

// Listener is the control socket and its connections.
type Listener struct {
	ln       *net.UnixListener
	b        Backend
	log      *zap.Logger
	max      int
	readSpin spin.Policy
	firstReq time.Duration
	closing  atomic.Bool
	wg       sync.WaitGroup // the accept loop and every connection's goroutines

	mu      sync.Mutex
	clients map[*client]struct{}
	subs    map[*client]struct{}       // connections that sent Subscribe
	waiting map[*net.UnixConn]struct{} // accepted, their first request not yet in (admit.go)
}

// Listen creates the control socket at path: its directory 0700, the
// socket 0600, so only the engine's user can talk to the sidecar. It
// refuses a path another sidecar serves and removes a stale socket of one
// that died. Nothing is served until Serve.
func Listen(path string, b Backend, log *zap.Logger, o Options) (*Listener, error) {
	// The directory first: nothing is dialed or removed in one that
	// another user could have put there.
	if err := unixsock.MakeDir(filepath.Dir(path), o.TrustSocketParent); err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
		_ = c.Close()
		return nil, fmt.Errorf("control socket %s: another staged is serving it; stop it or set control_socket", path)
	}
	_ = os.Remove(path) // a stale socket of a sidecar that died
	ln, err := unixsock.Listen(path, o.TrustSocketParent)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return &Listener{ln: ln, b: b, log: log, max: o.MaxClients, readSpin: o.ReadSpin, firstReq: o.FirstRequestTimeout,
		clients: map[*client]struct{}{}, subs: map[*client]struct{}{}, waiting: map[*net.UnixConn]struct{}{}}, nil
}

// Serve accepts connections in its own goroutine until Close.
func (l *Listener) Serve() {
	l.wg.Add(1)
	go l.accept()
}

func (l *Listener) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			if l.closing.Load() {
				return
			}
			l.log.Warn("accept on control socket", zap.Error(err))
			time.Sleep(50 * time.Millisecond)
			continue
		}
		l.mu.Lock()
		if n := len(l.clients) + len(l.waiting); n >= l.max {
			l.mu.Unlock()
			refuse(c, wire.CodeBusy, fmt.Sprintf("the sidecar has limits.max_clients (%d) control connections open; close one you do not use, or raise limits.max_clients", l.max))
			l.log.Warn("control socket: limits.max_clients reached; refused a connection", zap.Int("max", l.max))
			continue
		}
		l.waiting[c] = struct{}{}
		l.mu.Unlock()
		l.wg.Add(1)
		go l.admit(c)
	}
}

// start serves an admitted connection: its reader and writer.
func (l *Listener) start(c *net.UnixConn) {
	raw, err := c.SyscallConn()
	if err != nil {
		_ = c.Close()
		l.log.Warn("control socket: connection without a file descriptor", zap.Error(err))
		return
	}
	cl := &client{l: l, conn: c, raw: raw, out: make(chan *bytebufferpool.ByteBuffer, clientQueue), dead: make(chan struct{})}
	l.mu.Lock()
	delete(l.waiting, c)
	if l.closing.Load() {
		l.mu.Unlock()
		_ = c.Close()
		return
	}
	l.clients[cl] = struct{}{}
	l.mu.Unlock()
	l.wg.Add(2)
	cl.wg.Add(2)
	go cl.writeLoop()
	go cl.readLoop()
}

// Notify tells the subscribers of groups about a transfer that finished
// here (the groups owning its regions: nobody else hears of it); it
// never blocks.
func (l *Listener) Notify(n *wire.Notify, groups []string) {
	l.mu.Lock()
	var subs []*client
	for c := range l.subs {
		if slices.Contains(groups, c.owner.Group) {
			subs = append(subs, c)
		}
	}
	l.mu.Unlock()
	for _, c := range subs {
		c.reply(n)
	}
}

// StopAccepting closes the socket: no new connection comes in, the ones
// open go on until Close.
func (l *Listener) StopAccepting() {
	l.closing.Store(true)
	_ = l.ln.Close()
}

// Close stops accepting, ends every connection and waits for their
// goroutines, including requests answered aside (they end once the
// backend answers them).
func (l *Listener) Close() {
	l.StopAccepting()
	l.mu.Lock()
	cls := slices.Collect(maps.Keys(l.clients))
	for c := range l.waiting {
		_ = c.Close() // its admit returns and forgets it
	}
	l.mu.Unlock()
	for _, c := range cls {
		c.close()
	}
	l.wg.Wait()
}
