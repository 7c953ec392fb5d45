package main

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// zcWait bounds a wait for one zerocopy completion: past it the kernel
// is not answering and the run fails instead of hanging.
const zcWait = 10_000 // ms

// zcSender sends with sendmsg(MSG_ZEROCOPY) on a blocking SO_ZEROCOPY
// socket. Each sendmsg that sends anything takes the socket's next
// notification id; the kernel later reports ranges of ids done on the
// error queue. A ring slot is sent again only once the ids of its last
// send are done (until then the kernel may still read its pages).
type zcSender struct {
	mu     sync.Mutex
	fd     int
	closed bool

	next    uint64   // ids handed out so far
	done    uint64   // ids below this completed
	slotEnd []uint64 // per ring slot: its last send's ids are below this
	oob     []byte
	one     []byte // recvmsg's data buffer (a notification carries none)

	completions, copied int64
}

// newZCSender takes over c's socket in blocking mode with SO_ZEROCOPY on.
func newZCSender(c net.Conn, slots int) (*zcSender, error) {
	fd, err := dupBlocking(c)
	if err != nil {
		return nil, err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ZEROCOPY, 1); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("setsockopt SO_ZEROCOPY: %w (this kernel or socket refuses zerocopy sends)", err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("setsockopt TCP_NODELAY: %w", err)
	}
	return &zcSender{fd: fd, slotEnd: make([]uint64, slots), oob: make([]byte, unix.CmsgSpace(64)), one: make([]byte, 1)}, nil
}

// dupBlocking returns a blocking duplicate of c's socket and closes c.
func dupBlocking(c net.Conn) (int, error) {
	defer c.Close()
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1, fmt.Errorf("%T has no file descriptor", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("socket of the connection: %w", err)
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(f uintptr) { fd, derr = unix.Dup(int(f)) }); err != nil {
		return -1, fmt.Errorf("socket of the connection: %w", err)
	}
	if derr != nil {
		return -1, fmt.Errorf("dup socket: %w", derr)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("socket to blocking mode: %w", err)
	}
	return fd, nil
}

func (z *zcSender) send(slot int, head, payload []byte) error {
	if err := z.waitFor(z.slotEnd[slot]); err != nil {
		return err
	}
	bufs := [][]byte{head, payload}
	if len(head) == 0 {
		bufs = bufs[1:]
	}
	for len(bufs) > 0 {
		n, err := unix.SendmsgBuffers(z.fd, bufs, nil, nil, unix.MSG_ZEROCOPY|unix.MSG_NOSIGNAL)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOBUFS) && z.next > z.done:
			// Too many notifications outstanding (optmem_max): reap one.
			if err := z.waitFor(z.done + 1); err != nil {
				return err
			}
			continue
		case err != nil:
			return fmt.Errorf("sendmsg(MSG_ZEROCOPY): %w", err)
		}
		if n > 0 {
			z.next++
		}
		bufs = advance(bufs, n)
		if err := z.reap(false); err != nil {
			return err
		}
	}
	z.slotEnd[slot] = z.next
	return nil
}

// advance drops n written bytes from the front of bufs.
func advance(bufs [][]byte, n int) [][]byte {
	for len(bufs) > 0 && n >= len(bufs[0]) {
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	if len(bufs) > 0 {
		bufs[0] = bufs[0][n:]
	}
	return bufs
}

// finish waits for every send's completion.
func (z *zcSender) finish() error { return z.waitFor(z.next) }

// waitFor reaps completions until every id below id is done.
func (z *zcSender) waitFor(id uint64) error {
	for z.done < id {
		if err := z.reap(true); err != nil {
			return err
		}
	}
	return nil
}

// reap reads the completions queued on the error queue; with block, it
// first waits (up to zcWait) for at least one.
func (z *zcSender) reap(block bool) error {
	for {
		_, oobn, _, _, err := unix.Recvmsg(z.fd, z.one, z.oob, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN) && block:
			if err := z.pollErr(); err != nil {
				return err
			}
			continue
		case errors.Is(err, unix.EAGAIN):
			return nil
		case err != nil:
			return fmt.Errorf("read zerocopy completions (recvmsg MSG_ERRQUEUE): %w", err)
		}
		if err := z.note(z.oob[:oobn]); err != nil {
			return err
		}
		block = false
	}
}

// pollErr waits until the error queue holds something (POLLERR).
func (z *zcSender) pollErr() error {
	for {
		fds := []unix.PollFd{{Fd: int32(z.fd)}}
		n, err := unix.Poll(fds, zcWait)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("poll for zerocopy completions: %w", err)
		case n == 0:
			return fmt.Errorf("no zerocopy completion within %d ms (%d of %d ids done)", zcWait, z.done, z.next)
		}
		return nil
	}
}

// note counts the completions in one error-queue message's control data.
func (z *zcSender) note(oob []byte) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return fmt.Errorf("zerocopy completion's control data: %w", err)
	}
	for _, m := range msgs {
		ip := m.Header.Level == unix.SOL_IP && m.Header.Type == unix.IP_RECVERR
		ip6 := m.Header.Level == unix.SOL_IPV6 && m.Header.Type == unix.IPV6_RECVERR
		if !ip && !ip6 {
			continue
		}
		if len(m.Data) < int(unsafe.Sizeof(unix.SockExtendedErr{})) {
			return fmt.Errorf("error-queue entry of %d B, want %d", len(m.Data), int(unsafe.Sizeof(unix.SockExtendedErr{})))
		}
		ee := (*unix.SockExtendedErr)(unsafe.Pointer(&m.Data[0]))
		if ee.Origin != unix.SO_EE_ORIGIN_ZEROCOPY || ee.Errno != 0 {
			return fmt.Errorf("error-queue entry of origin %d, errno %d: not a zerocopy completion", ee.Origin, ee.Errno)
		}
		if ee.Info != uint32(z.done) || ee.Data < ee.Info {
			return fmt.Errorf("zerocopy completion of ids %d..%d, expected the next from %d", ee.Info, ee.Data, uint32(z.done))
		}
		k := uint64(ee.Data-ee.Info) + 1
		z.done += k
		z.completions += int64(k)
		if ee.Code&unix.SO_EE_CODE_ZEROCOPY_COPIED != 0 {
			z.copied += int64(k)
		}
	}
	return nil
}

func (z *zcSender) shutdown() {
	z.mu.Lock()
	defer z.mu.Unlock()
	if !z.closed {
		_ = unix.Shutdown(z.fd, unix.SHUT_RDWR)
	}
}

func (z *zcSender) close() {
	z.mu.Lock()
	defer z.mu.Unlock()
	if !z.closed {
		z.closed = true
		_ = unix.Close(z.fd)
	}
}
