// Package rawconn drives a TCP socket with blocking system calls: one
// writev per send, one recv(MSG_WAITALL) per receive, straight from and
// into the caller's buffer (a pinned slot). Go's netpoller would wake the
// reader for every few hundred KiB that arrive; at tens of GB/s those
// wake-ups are what separates Go sockets from C ones.
//
// A Conn is used by at most one reader and one writer goroutine; a blocked
// call holds only its own thread. Shutdown wakes both; the socket closes
// when both have called Done. It never allocates per call.
package rawconn

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/internal/spin"
)

// Conn is a TCP socket in blocking mode.
type Conn struct {
	fd     int
	spin   spin.Adaptive // ReadFull's polling window; only the reader touches it
	mu     sync.Mutex
	users  int // reader and writer still inside; the last one out closes
	closed bool
	// pipe and pipeCap: the writer's pipe for WriteSplice (splice.go),
	// made on first use; pipeCap 0 when there is none.
	pipe    [2]int
	pipeCap int
}

// SetSpin makes ReadFull poll the socket (recv with MSG_DONTWAIT) before
// it blocks, for p's window: a frame that arrives within it is read
// without the reader's thread being put to sleep and woken, which is most
// of a small message's latency on one host. Under an adaptive p the
// window follows the waits ReadFull saw (spin.Adaptive); either way the
// thread stays busy for one window after the last frame, then sleeps.
// Call it before the reader starts.
func (r *Conn) SetSpin(p spin.Policy) { r.spin = p.New() }

// New takes over c's socket: it keeps a duplicate in blocking mode and
// closes c. users is how many goroutines will call Done (1 or 2).
func New(c net.Conn, users int) (*Conn, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("data stream: %T has no file descriptor", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(f uintptr) { fd, derr = unix.Dup(int(f)) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, fmt.Errorf("data stream: dup socket: %w", derr)
	}
	_ = c.Close() // our duplicate keeps the socket open
	if err := unix.SetNonblock(fd, false); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("data stream: blocking mode: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	return &Conn{fd: fd, users: users}, nil
}

// Shutdown wakes the reader and writer out of blocking calls; the socket is
// closed when both have called done.
func (r *Conn) Shutdown() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		_ = unix.Shutdown(r.fd, unix.SHUT_RDWR)
	}
}

// Done is called once by each user when it stops; the last closes the socket.
func (r *Conn) Done() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.users--
	if r.users == 0 {
		r.closePipe()
		_ = unix.Close(r.fd)
	}
}

// Moved reports the kernel's running byte counts of the socket (TCP_INFO):
// bytes of ours the peer acknowledged, and bytes received from it. A
// watchdog compares them over time to tell a stalled stream from a slow
// one, at no cost to the data path: a blocked writev or recv shows no
// progress of its own until it returns. It fails once the socket closed.
func (r *Conn) Moved() (acked, received uint64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock() // Done closes the fd under mu: it cannot be reused meanwhile
	if r.users == 0 {
		return 0, 0, net.ErrClosed
	}
	return tcpMoved(r.fd)
}

// tcpMoved reads fd's TCP_INFO byte counts.
func tcpMoved(fd int) (acked, received uint64, err error) {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return 0, 0, fmt.Errorf("TCP_INFO: %w", err)
	}
	return info.Bytes_acked, info.Bytes_received, nil
}

// MovedFD is Moved for a socket not driven by a Conn (a TLS stream's).
func MovedFD(c syscall.Conn) (acked, received uint64, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	cerr := rc.Control(func(fd uintptr) { acked, received, err = tcpMoved(int(fd)) })
	if cerr != nil {
		return 0, 0, cerr
	}
	return acked, received, err
}

// Writev writes every byte of bufs (it reslices bufs as it goes).
func (r *Conn) Writev(bufs [][]byte) error {
	for len(bufs) > 0 {
		n, err := unix.Writev(r.fd, bufs)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		for n > 0 && len(bufs) > 0 {
			if n >= len(bufs[0]) {
				n -= len(bufs[0])
				bufs = bufs[1:]
			} else {
				bufs[0] = bufs[0][n:]
				n = 0
			}
		}
		for len(bufs) > 0 && len(bufs[0]) == 0 {
			bufs = bufs[1:]
		}
	}
	return nil
}

// TryWrite sends what of b fits in the socket's buffer now, without
// blocking (MSG_DONTWAIT): n may be anything from 0 (buffer full) to
// len(b). A goroutine that must never wait on the peer (a reader) uses it.
func (r *Conn) TryWrite(b []byte) (int, error) {
	for {
		n, err := unix.SendmsgN(r.fd, b, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		switch {
		case err == nil:
			return n, nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return 0, nil
		}
		return 0, err
	}
}

// Read implements io.Reader (for headers): one recv, whatever arrived.
func (r *Conn) Read(p []byte) (int, error) {
	for {
		n, _, err := unix.Recvfrom(r.fd, p, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return 0, err
		}
		if n == 0 && len(p) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

// ReadFull fills p, asking the kernel to return only once it is full
// (after polling for a while, see SetSpin).
func (r *Conn) ReadFull(p []byte) error {
	if w := r.spin.Next(); w > 0 && len(p) > 0 {
		n, start, err := r.poll(p, w)
		if err != nil {
			return err
		}
		if n == 0 && r.spin.Policy().Adaptive() {
			// Asleep until the first bytes come, to time the wait.
			if n, err = r.recv(p, 0); err != nil {
				return err
			}
		}
		if n > 0 && !start.IsZero() {
			r.spin.Observe(time.Since(start))
		}
		p = p[n:]
	}
	for len(p) > 0 {
		n, err := r.recv(p, unix.MSG_WAITALL)
		if err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// recv is one blocking recv into p (len(p) > 0) with flags; the peer's
// close is io.ErrUnexpectedEOF.
func (r *Conn) recv(p []byte, flags int) (int, error) {
	for {
		n, _, err := unix.Recvfrom(r.fd, p, flags)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return 0, err
		}
		if n == 0 {
			return 0, io.ErrUnexpectedEOF
		}
		return n, nil
	}
}

// poll reads what arrives in p within d, without blocking; it stops at
// the first bytes. start is when it began to wait (zero when the first
// recv found bytes: no wait); n is 0 when d passed without any.
func (r *Conn) poll(p []byte, d time.Duration) (n int, start time.Time, err error) {
	var deadline time.Time
	for i := 0; ; i++ {
		// A raw system call: the scheduler is not told, so the goroutine
		// keeps its processor through thousands of polls.
		r1, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(r.fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), unix.MSG_DONTWAIT, 0, 0)
		n := int(r1)
		switch {
		case errno == 0 && n == 0:
			return 0, start, io.ErrUnexpectedEOF
		case errno == 0:
			return n, start, nil
		case errno == unix.EAGAIN, errno == unix.EINTR:
		default:
			return 0, start, errno
		}
		// The clock is read every few polls only: a poll is a system call
		// of well under a microsecond.
		if i%16 == 0 {
			now := time.Now()
			if start.IsZero() {
				start, deadline = now, now.Add(d)
			} else if now.After(deadline) {
				return 0, start, nil
			}
		}
		if i == 0 {
			// What this reader just handed on runs first; the wait counts
			// from before it.
			spin.YieldFirst()
		}
	}
}

// Discard reads and drops n bytes.
func (r *Conn) Discard(n int64, scratch []byte) error {
	for n > 0 {
		k := min(n, int64(len(scratch)))
		if err := r.ReadFull(scratch[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}
