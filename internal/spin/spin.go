// Package spin waits for a socket to become readable by polling it, for a
// bounded time, instead of sleeping in a read. On a virtual machine a
// thread put to sleep costs 50-200 us to wake again (its idle vCPU must be
// woken); a thread that polls finds the bytes within a microsecond or
// two. The sidecar's node-socket and engine-connection readers and the Go
// client use it; the price is a busy core while it polls.
//
// A fixed window misses a steady pace just longer than itself (a push
// checked after each, the check lasting 150 us: the readers fall asleep
// before every next message), and a longer fixed window burns a core after
// every idle stretch. Adaptive sets each reader's window from the waits it
// saw: covering a steady pace up to MaxWindow, back to Window when the
// waits grow past that (adaptive.go).
package spin

import (
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Window is how long a reader polls by default, where polling is on
// (Default), and the base of the adaptive window (Auto). Measured on 2 x H200 (docs/BENCHMARKS.md): 100 us took a 4
// KiB push from p50 54-63 us to 30-33 us; 30 us was worse than none (the
// reader gives up just before the answer comes).
const Window = 100 * time.Microsecond

// MinCPUs is the fewest CPUs on which readers poll by default: polling
// keeps a core busy for up to Window after each frame, which a small
// machine cannot spare (like the CUDA driver's automatic scheduling, which
// spins only where there are spare cores).
const MinCPUs = 8

// Default is the fixed polling window of this machine: Window on machines
// of MinCPUs or more, 0 (never poll) below. Readers that adapt their
// window use DefaultPolicy.
func Default() time.Duration { return For(runtime.NumCPU()) }

// For is Default's rule for a machine of ncpu CPUs.
func For(ncpu int) time.Duration {
	if ncpu < MinCPUs {
		return 0
	}
	return Window
}

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

// Await waits, for a reader under a, until c has bytes to read (or an
// error, or the peer's close): it polls for a.Next(), then sleeps in Go's
// poller, and tells a how long it waited. A reader whose policy is off
// returns at once, as does one whose bytes are already there (that is not
// a wait). The read that follows finds the bytes without sleeping.
func Await(c syscall.Conn, a *Adaptive) {
	w := a.Next()
	if w <= 0 {
		return
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	start, polled, _ := pollWindow(rc, w)
	if start.IsZero() {
		return
	}
	if !polled {
		// Asleep until the bytes come: rc.Read calls the function again
		// each time the poller says the socket became readable. An error
		// (a deadline, the socket closed) is the read's to report.
		if err := rc.Read(func(fd uintptr) bool { return ready(int(fd)) }); err != nil {
			return
		}
	}
	a.Observe(time.Since(start))
}

// pollWindow is the first part of a reader's wait on rc: none when bytes
// are there already (start zero), else a poll of up to w from start;
// polled says whether they came within it.
func pollWindow(rc syscall.RawConn, w time.Duration) (start time.Time, polled bool, err error) {
	err = rc.Control(func(fd uintptr) {
		if ready(int(fd)) {
			return
		}
		start = time.Now()
		polled = w > 0 && Poll(int(fd), w)
	})
	return start, polled, err
}

// YieldFirst is what a reader does once before it starts to poll: let
// run any goroutine it just woke. Go queues a goroutine woken by a channel
// send, or started with go, to run next on the waker's processor, and a
// reader that then polls keeps that processor; the woken goroutine (the
// caller waiting for an answer, a transfer's copy) would wait until an
// idle thread, itself asleep, is woken and takes it over: 100-150 us on
// an idle machine (docs/BENCHMARKS.md, the ipc row). Yielding once puts
// the reader behind it instead; where nothing else is runnable the reader
// goes on at once.
func YieldFirst() { runtime.Gosched() }

// ready reports whether fd has input (or an error condition) now.
func ready(fd int) bool {
	pfd := unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	var zero unix.Timespec
	n, _, errno := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&zero)), 0, 0, 0)
	return n > 0 || (errno != 0 && errno != unix.EINTR)
}

// Poll polls fd for input for up to d; it reports whether input (or an
// error condition) is there. It yields once before polling (YieldFirst).
func Poll(fd int, d time.Duration) bool {
	var deadline time.Time
	for i := 0; ; i++ {
		// A raw system call (ready): the Go scheduler is not told, so the
		// goroutine keeps its processor instead of handing it off (and
		// having to win it back) on every one of thousands of polls.
		if ready(fd) {
			return true
		}
		if i == 0 {
			YieldFirst()
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
