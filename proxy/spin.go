package proxy

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// spinReadable polls c until bytes arrive or d passes, without sleeping;
// the read that follows then finds them at once. On a virtual machine a
// thread put to sleep in a read costs 50-200 us to wake again (the idle
// vCPU must be woken), which is most of a same-node transfer's overhead
// and of a small push's latency; polling trades that for a busy core
// during d. d <= 0 returns at once.
func spinReadable(c syscall.Conn, d time.Duration) {
	if d <= 0 {
		return
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		var deadline time.Time
		for i := 0; ; i++ {
			n, err := unix.Poll(pfd, 0)
			if n > 0 || (err != nil && err != unix.EINTR) {
				return
			}
			// The clock is read every few polls: a poll costs well under
			// a microsecond.
			if i%16 == 0 {
				now := time.Now()
				if deadline.IsZero() {
					deadline = now.Add(d)
				} else if now.After(deadline) {
					return
				}
			}
		}
	})
}
