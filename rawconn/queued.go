package rawconn

import (
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// Queued is how many bytes written to the socket the peer has not
// acknowledged yet: those still unsent plus those in flight, exactly, as
// the kernel counts them (SIOCOUTQ). A sender balancing chunks across
// streams reads it to see which socket will drain first. One ioctl, no
// allocation; BenchmarkQueued compares it with the TCP_INFO way
// (tcpi_notsent_bytes + tcpi_unacked x tcpi_snd_mss), which copies the
// whole struct and counts in-flight bytes by segment. It fails once the
// socket closed.
func (r *Conn) Queued() (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock() // Done closes the fd under mu: it cannot be reused meanwhile
	if r.users == 0 {
		return 0, net.ErrClosed
	}
	return tcpQueued(r.fd)
}

// tcpQueued reads fd's unacknowledged bytes (SIOCOUTQ, Linux's TIOCOUTQ on
// a TCP socket).
func tcpQueued(fd int) (uint64, error) {
	n, err := unix.IoctlGetInt(fd, unix.TIOCOUTQ)
	if err != nil {
		return 0, fmt.Errorf("SIOCOUTQ: %w", err)
	}
	if n < 0 {
		return 0, fmt.Errorf("SIOCOUTQ: kernel reported %d bytes", n)
	}
	return uint64(n), nil
}

// tcpQueuedInfo is tcpQueued read from TCP_INFO: the bytes not sent yet,
// and the segments sent but not acknowledged at the current MSS (an
// estimate: segments need not be full). Kept for BenchmarkQueued.
func tcpQueuedInfo(fd int) (uint64, error) {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return 0, fmt.Errorf("TCP_INFO: %w", err)
	}
	return uint64(info.Notsent_bytes) + uint64(info.Unacked)*uint64(info.Snd_mss), nil
}

// QueuedFD is Queued for a socket not driven by a Conn (a TLS stream's).
func QueuedFD(c syscall.Conn) (n uint64, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	cerr := rc.Control(func(fd uintptr) { n, err = tcpQueued(int(fd)) })
	if cerr != nil {
		return 0, cerr
	}
	return n, err
}
