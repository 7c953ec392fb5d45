// Package tlsconn drives a data stream over crypto/tls with the method set
// of rawconn.Conn, so the proxy's chunk reader and writer run unchanged on
// either. It is what a data stream uses when security.tls is on.
//
// Unlike rawconn it cannot write from or read into the caller's buffer
// without a copy: every record is encrypted into, and decrypted in, the
// tls.Conn's own buffers, and the socket stays on Go's netpoller. It never
// allocates per call once the tls.Conn's buffers have grown. TryWrite
// never writes (a TLS record cannot be half sent without blocking), so
// small frames a reader queues go out through the writer goroutine.
//
// A Conn is used by at most one reader and one writer goroutine. Shutdown
// wakes both; the connection closes when both have called Done.
package tlsconn

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/rawconn"
)

// Conn is an established TLS connection carrying a data stream.
type Conn struct {
	tc     *tls.Conn
	raw    net.Conn
	mu     sync.Mutex
	users  int
	closed bool
}

// ErrShutdown is what a call blocked when Shutdown ran, or made after it,
// returns (wrapped).
var ErrShutdown = errors.New("tlsconn: stream shut down")

// New takes over c, whose handshake must be complete. users is how many
// goroutines will call Done (1 or 2).
func New(c *tls.Conn, users int) (*Conn, error) {
	if !c.ConnectionState().HandshakeComplete {
		return nil, errors.New("data stream: TLS handshake not complete")
	}
	if tc, ok := c.NetConn().(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	return &Conn{tc: c, raw: c.NetConn(), users: users}, nil
}

// SetSpin does nothing: the socket stays on Go's netpoller, which has no
// use for polling before it blocks.
func (c *Conn) SetSpin(spin.Policy) {}

// Shutdown wakes the reader and writer out of blocking calls and tells the
// peer (its reads end); the connection is closed when both called Done.
func (c *Conn) Shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	_ = c.raw.SetDeadline(time.Unix(1, 0))
	if tc, ok := c.raw.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// Done is called once by each user when it stops; the last closes the
// connection (without a close_notify: a stream ends by Shutdown or loss).
func (c *Conn) Done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.users--
	if c.users == 0 {
		_ = c.raw.Close()
	}
}

// err turns an error of a call that Shutdown woke into ErrShutdown. Most
// are the deadline it sets, but a write can fail first with EPIPE from its
// CloseWrite, and either may come first.
func (c *Conn) err(e error) error {
	if e == nil {
		return nil
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return fmt.Errorf("%w (%v)", ErrShutdown, e)
	}
	return e
}

// Writev writes every byte of bufs, in order. Each buffer becomes one or
// more TLS records; nothing is copied in user space beyond encryption.
func (c *Conn) Writev(bufs [][]byte) error {
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if _, err := c.tc.Write(b); err != nil {
			return c.err(err)
		}
	}
	return nil
}

// Moved reports the socket's byte counts from the kernel (rawconn.Moved):
// TLS records, not plaintext, which is all a stall watchdog needs.
func (c *Conn) Moved() (acked, received uint64, err error) {
	sc, ok := c.raw.(syscall.Conn)
	if !ok {
		return 0, 0, fmt.Errorf("data stream: %T has no file descriptor", c.raw)
	}
	return rawconn.MovedFD(sc)
}

// Queued reports the socket's unacknowledged bytes (rawconn.Queued): TLS
// records, a little more than the plaintext, which is all balancing
// streams against each other needs.
func (c *Conn) Queued() (uint64, error) {
	sc, ok := c.raw.(syscall.Conn)
	if !ok {
		return 0, fmt.Errorf("data stream: %T has no file descriptor", c.raw)
	}
	return rawconn.QueuedFD(sc)
}

// TryWrite writes nothing and reports 0: a TLS record cannot be partly
// sent without blocking until the rest is. Callers queue b for the writer.
func (c *Conn) TryWrite([]byte) (int, error) { return 0, nil }

// Read implements io.Reader: whatever decrypted bytes are ready, at least one.
func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.tc.Read(p)
	return n, c.err(err)
}

// ReadFull fills p.
func (c *Conn) ReadFull(p []byte) error {
	if _, err := io.ReadFull(c.tc, p); err != nil {
		return c.err(err)
	}
	return nil
}

// Discard reads and drops n bytes.
func (c *Conn) Discard(n int64, scratch []byte) error {
	for n > 0 {
		k := min(n, int64(len(scratch)))
		if err := c.ReadFull(scratch[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}
