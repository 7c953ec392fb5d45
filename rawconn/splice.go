package rawconn

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Splice send: the payload's pages are handed to the socket by reference
// (vmsplice into a pipe, splice from the pipe into the socket) instead of
// copied by writev. The kernel then holds the caller's pages until the
// bytes have left every socket buffer, on one host the receiver's too: the
// caller must not write into them until the peer proved it read them (see
// staging's splice mode).

// defaultPipeMax is used when /proc/sys/fs/pipe-max-size cannot be read
// (the kernel's default for it).
const defaultPipeMax = 1 << 20

var pipeMax = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/sys/fs/pipe-max-size")
	if err != nil {
		return defaultPipeMax
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return defaultPipeMax
	}
	return n
})

// spliceRefused reports vmsplice errors that mean "not this memory" (or
// not this kernel): the bytes can still go by writev.
func spliceRefused(err error) bool {
	return errors.Is(err, unix.EFAULT) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS)
}

// WriteSplice writes head (with MSG_MORE, so head and payload leave in the
// same segments), then payload by reference, a pipe's worth at a time.
// spliced says whether the kernel took any of payload's pages by reference:
// then they must stay unwritten until the peer read them. When vmsplice
// refuses the memory (EFAULT, EINVAL, ENOSYS), the rest of payload goes by
// writev and refused is that error (for the caller to log once); err is
// then nil if the writev worked. A Shutdown wakes a WriteSplice blocked on
// a full socket.
func (r *Conn) WriteSplice(head, payload []byte) (spliced bool, refused, err error) {
	if len(payload) == 0 {
		return false, nil, r.Writev([][]byte{head})
	}
	if err := r.sendMore(head); err != nil {
		return false, nil, fmt.Errorf("send chunk head (MSG_MORE): %w", err)
	}
	p, cp, err := r.splicePipe(len(payload))
	if err != nil {
		return false, nil, err
	}
	for off := 0; off < len(payload); {
		n := min(len(payload)-off, cp)
		k, err := vmspliceFn(p[1], payload[off:off+n])
		if err != nil {
			if spliceRefused(err) {
				return off > 0, fmt.Errorf("vmsplice %d B at %p: %w", n, &payload[off], err), r.Writev([][]byte{payload[off:]})
			}
			r.dropPipe()
			return off > 0, nil, fmt.Errorf("vmsplice %d B into the send pipe: %w", n, err)
		}
		if err := r.drainPipe(p[0], k, off+k < len(payload)); err != nil {
			r.dropPipe() // it may hold bytes that must never reach the socket
			return true, nil, err
		}
		off += k
	}
	return true, nil, nil
}

// PrepareSplice makes the Conn's splice pipe now, sized for payloads of n
// bytes (up to pipe-max-size), instead of at the first WriteSplice: a
// sidecar that makes it when the stream attaches keeps its descriptor
// count flat while streams carry traffic, and sizes it by its slots.
func (r *Conn) PrepareSplice(n int) error {
	_, _, err := r.splicePipe(n)
	return err
}

// sendMore sends all of b with MSG_MORE.
func (r *Conn) sendMore(b []byte) error {
	for len(b) > 0 {
		n, err := unix.SendmsgN(r.fd, b, nil, nil, unix.MSG_MORE|unix.MSG_NOSIGNAL)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		b = b[n:]
	}
	return nil
}

// vmspliceFn is vmsplice; tests replace it to make the kernel refuse.
var vmspliceFn = vmsplice

// vmsplice maps b's pages into the pipe (non-blocking on the pipe: the
// pipe is empty and at least len(b) large, so EAGAIN means a bug, and
// must not hang the writer).
func vmsplice(w int, b []byte) (int, error) {
	iov := []unix.Iovec{{Base: &b[0]}}
	iov[0].SetLen(len(b))
	for {
		k, err := unix.Vmsplice(w, iov, unix.SPLICE_F_NONBLOCK)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return 0, err
		case k <= 0:
			return 0, fmt.Errorf("vmsplice took %d of %d B", k, len(b))
		}
		return k, nil
	}
}

// drainPipe splices n bytes from the pipe into the socket, blocking on
// the socket.
func (r *Conn) drainPipe(pr, n int, more bool) error {
	flags := unix.SPLICE_F_MOVE
	if more {
		flags |= unix.SPLICE_F_MORE
	}
	for n > 0 {
		m, err := unix.Splice(pr, nil, r.fd, nil, n, flags)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			// EAGAIN included: the socket is blocking, so retrying
			// could only spin.
			return fmt.Errorf("splice %d B from the send pipe to the socket: %w", n, err)
		case m <= 0:
			return fmt.Errorf("splice from the send pipe to the socket moved nothing (%d B left)", n)
		}
		n -= int(m)
	}
	return nil
}

// splicePipe returns the Conn's pipe and its capacity, making it on first
// use, sized for payloads of n bytes up to the system's pipe-max-size.
func (r *Conn) splicePipe(n int) ([2]int, int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pipeCap > 0 {
		return r.pipe, r.pipeCap, nil
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return p, 0, fmt.Errorf("make the splice pipe: %w", err)
	}
	want := min(max(n, 64<<10), pipeMax())
	// A smaller pipe than asked (EPERM past the user's pipe allowance) only
	// costs more rounds: keep what the kernel gives.
	_, _ = unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, want)
	got, err := unix.FcntlInt(uintptr(p[1]), unix.F_GETPIPE_SZ, 0)
	if err != nil || got <= 0 {
		_ = unix.Close(p[0])
		_ = unix.Close(p[1])
		return p, 0, fmt.Errorf("size of the splice pipe (F_GETPIPE_SZ): %v", err)
	}
	r.pipe, r.pipeCap = p, got
	return p, got, nil
}

// dropPipe closes the pipe after a failed write; a later WriteSplice
// makes a fresh one.
func (r *Conn) dropPipe() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closePipe()
}

// closePipe closes the pipe if there is one; r.mu is held.
func (r *Conn) closePipe() {
	if r.pipeCap > 0 {
		_ = unix.Close(r.pipe[0])
		_ = unix.Close(r.pipe[1])
		r.pipeCap = 0
	}
}
