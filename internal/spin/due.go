package spin

import (
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A message due at a known time. Some waits have an end the reader can
// foresee: an exporter waits for the DirectDone of a copy whose pace it
// saw, an engine for the answer to a transfer of known size. Such a wait
// is far longer than a polling window, so the reader would sleep, and the
// message would wait for its thread to be woken (50-150 us on an idle
// machine, in the transfer's critical path). Instead the reader sleeps in
// the kernel until a little before the due time, then polls through it:
// its thread is awake when the message comes. A message that comes earlier
// still ends the sleep at once.

const (
	// DueLead is how long before the due time a reader starts to poll at
	// least: the kernel's timer slack (50 us), the thread's wake-up, and a
	// message a little earlier than foreseen.
	DueLead = 500 * time.Microsecond
	// DueSpinMax bounds the poll around the due time: a message much later
	// than foreseen costs one poll this long, then a sleep in the read as
	// without a due time.
	DueSpinMax = 3 * time.Millisecond
	// DueMinSleep: a wait shorter than this is polled through, not slept.
	DueMinSleep = time.Millisecond
	// dueSlice is the longest one kernel sleep lasts: between slices the
	// reader lets go of the socket, so a connection closed meanwhile is
	// noticed within one.
	dueSlice = 20 * time.Millisecond
)

// Due is a message expected Expect after Start.
type Due struct {
	Start  time.Time
	Expect time.Duration
}

// Pace is how long a message took to come per byte of the work it
// answered (a copy, a transfer), in nanoseconds; 0 when none was seen.
type Pace float64

// PaceOf is the pace of n bytes answered el after they were started: 0
// for nothing (n or el 0).
func PaceOf(el time.Duration, n uint64) Pace {
	if el <= 0 || n == 0 {
		return 0
	}
	return Pace(float64(el) / float64(n))
}

// Due is when the answer to n bytes started at start comes at pace p:
// zero (nothing due) without a pace, a start or bytes.
func (p Pace) Due(start time.Time, n uint64) Due {
	if p <= 0 || start.IsZero() || n == 0 {
		return Due{}
	}
	return Due{Start: start, Expect: time.Duration(float64(p) * float64(n))}
}

// Plan says how a reader waits for d at now: asleep for sleep (0: not at
// all), then polling for poll. The poll starts a lead before the due time
// (DueLead, or a sixteenth of the wait if longer) and lasts as long past
// it, within DueSpinMax. Both are 0 for a zero Due or one long past.
func (d Due) Plan(now time.Time) (sleep, poll time.Duration) {
	if d.Start.IsZero() || d.Expect <= 0 {
		return 0, 0
	}
	lead := max(DueLead, d.Expect/16)
	if sleep = d.Start.Add(d.Expect - lead).Sub(now); sleep < DueMinSleep {
		sleep = 0
	}
	end := d.Start.Add(d.Expect + lead)
	return sleep, max(min(end.Sub(now.Add(sleep)), DueSpinMax), 0)
}

// AwaitDue waits for c to be readable (or an error, or the peer's close):
// asleep in the kernel for up to sleep, then polling for up to poll. It
// returns at once when bytes are there.
func AwaitDue(c syscall.Conn, sleep, poll time.Duration) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	for end := time.Now().Add(sleep); ; {
		left := time.Until(end)
		if left <= 0 {
			break
		}
		got := false
		if err := rc.Control(func(fd uintptr) { got = SleepReadable(int(fd), min(left, dueSlice)) }); err != nil || got {
			return
		}
	}
	_ = rc.Control(func(fd uintptr) { Poll(int(fd), poll) })
}

// SleepReadable blocks in ppoll until fd is readable (or in error) or d
// passed; it reports whether fd is readable.
func SleepReadable(fd int, d time.Duration) bool {
	n, err := sleepPoll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, d)
	return err != nil || n > 0
}

// sleepPoll blocks in ppoll for up to d until one of pfds has input, and
// returns how many have (their Revents set). A signal's interruption
// sleeps again for what is left.
func sleepPoll(pfds []unix.PollFd, d time.Duration) (int, error) {
	end := time.Now().Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			return 0, nil
		}
		ts := unix.NsecToTimespec(int64(left))
		n, err := unix.Ppoll(pfds, &ts, nil)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// Kick is an eventfd that wakes a reader asleep in AwaitOr, so that it can
// plan its wait again (a message became due meanwhile) or see its
// connection closed. Wake and Close may be called from any goroutine, in
// any order: a Wake after Close does nothing.
type Kick struct {
	mu     sync.Mutex
	fd     int
	closed bool
}

// NewKick makes a Kick; the caller closes it.
func NewKick() (*Kick, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &Kick{fd: fd}, nil
}

// Wake wakes the reader (once, however often it is called before the
// reader sees it).
func (k *Kick) Wake() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.closed {
		one := [8]byte{1}
		_, _ = unix.Write(k.fd, one[:])
	}
}

// drain takes the wake-ups (the reader, before Close).
func (k *Kick) drain() {
	var b [8]byte
	_, _ = unix.Read(k.fd, b[:])
}

// Close closes the eventfd, once; no reader may be in AwaitOr.
func (k *Kick) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	k.closed = true
	return unix.Close(k.fd)
}

// AwaitOr is Await for a reader that k can wake: it polls c for a.Next(),
// then sleeps in the kernel until c has bytes (or an error, or the peer's
// close) or k is woken. It reports whether k woke it (the caller plans
// its wait again). It returns false at once when c is closed.
func AwaitOr(c syscall.Conn, a *Adaptive, k *Kick) (kicked bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	start, polled, err := pollWindow(rc, a.Next())
	if err != nil || start.IsZero() {
		return false
	}
	if polled {
		a.Observe(time.Since(start))
		return false
	}
	for {
		var got, woke bool
		if err := rc.Control(func(fd uintptr) {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(k.fd), Events: unix.POLLIN}}
			if n, err := sleepPoll(pfd, time.Second); err == nil && n > 0 {
				got, woke = pfd[0].Revents != 0, pfd[1].Revents != 0
			}
		}); err != nil {
			return false
		}
		if woke {
			k.drain()
		}
		if got {
			a.Observe(time.Since(start))
			return false
		}
		if woke {
			return true
		}
	}
}
