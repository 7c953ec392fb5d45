// Package spin waits for a socket to become readable by polling it, for a
// bounded time, instead of sleeping in a read. On a virtual machine a
// thread put to sleep costs 50-200 us to wake again (its idle vCPU must be
// woken); a thread that polls finds the bytes within a microsecond or
// two. The sidecar's node-socket and engine-connection readers and the Go
// client use it; the price is a busy core while it polls.
package spin

import (
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Readable polls c until bytes (or an error, or the peer's close) are
// there to read, or d has passed; the read that follows then finds them
// without sleeping. d <= 0 returns at once.
func Readable(c syscall.Conn, d time.Duration) {
	if d <= 0 {
		return
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) { Poll(int(fd), d) })
}

// Poll polls fd for input for up to d; it reports whether input (or an
// error condition) is there.
func Poll(fd int, d time.Duration) bool {
	pfd := unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	var zero unix.Timespec
	var deadline time.Time
	for i := 0; ; i++ {
		// A raw system call: the Go scheduler is not told, so the
		// goroutine keeps its processor instead of handing it off (and
		// having to win it back) on every one of thousands of polls.
		n, _, errno := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&zero)), 0, 0, 0)
		if n > 0 || (errno != 0 && errno != unix.EINTR) {
			return true
		}
		// The clock is read every few polls: a poll costs well under a
		// microsecond.
		if i%16 == 0 {
			now := time.Now()
			if deadline.IsZero() {
				deadline = now.Add(d)
			} else if now.After(deadline) {
				return false
			}
		}
	}
}
