package spin

import (
	"net"
	"runtime"
	"testing"
	"time"
)

// tcpPair is a loopback TCP connection: the client's end and the
// server's, both closed when the test ends.
func tcpPair(t *testing.T) (cl net.Conn, srv *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	cl, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { s.Close() })
	return cl, s.(*net.TCPConn)
}

func TestReadable(t *testing.T) {
	cl, tc := tcpPair(t)
	rc, err := tc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	poll := func(d time.Duration) (got bool) {
		_ = rc.Control(func(fd uintptr) { got = Poll(int(fd), d) })
		return got
	}
	// Nothing sent: the poll gives up after about d.
	start := time.Now()
	if poll(2 * time.Millisecond) {
		t.Fatal("Poll reported input on an idle socket")
	}
	if el := time.Since(start); el < 2*time.Millisecond {
		t.Fatalf("Poll gave up after %s, before its 2ms", el)
	}
	// Bytes on their way: the poll sees them.
	go func() {
		time.Sleep(time.Millisecond)
		_, _ = cl.Write([]byte("x"))
	}()
	if !poll(5 * time.Second) {
		t.Fatal("Poll missed the byte that arrived")
	}
	Readable(tc, time.Second) // returns at once: the byte is there
	buf := make([]byte, 1)
	if n, err := tc.Read(buf); n != 1 || err != nil {
		t.Fatalf("read after Readable: %d, %v", n, err)
	}
	// The peer's close counts as readable (the read returns EOF).
	cl.Close()
	if !poll(5 * time.Second) {
		t.Fatal("Poll missed the peer's close")
	}
	// d <= 0 returns at once.
	Readable(tc, 0)
}

func TestFor(t *testing.T) {
	for _, tc := range []struct {
		ncpu int
		want time.Duration
	}{{1, 0}, {2, 0}, {MinCPUs - 1, 0}, {MinCPUs, Window}, {16, Window}, {128, Window}} {
		if got := For(tc.ncpu); got != tc.want {
			t.Errorf("For(%d) = %s, want %s", tc.ncpu, got, tc.want)
		}
	}
}

// TestAwait: a reader under an adaptive policy records how long it waited
// for each message, polling (the message came within the window) or
// asleep (it came after), and not a message that was there at once.
func TestAwait(t *testing.T) {
	cl, tc := tcpPair(t)
	a := Policy{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond}.New()
	buf := make([]byte, 1)
	// The first delay ends within the polling window, the second after it
	// (Await then sleeps in the poller). The sender's clock starts when
	// this goroutine is about to wait, and the recorded wait must hold at
	// least half the delay: a loaded machine may stall this goroutine for
	// a while between the two.
	for i, delay := range []time.Duration{4 * time.Millisecond, 20 * time.Millisecond, 0} {
		done := make(chan struct{})
		ready := make(chan struct{})
		go func() {
			defer close(done)
			<-ready
			if delay > 0 {
				time.Sleep(delay)
			}
			_, _ = cl.Write([]byte("x"))
		}()
		if delay == 0 {
			close(ready)
			<-done
			time.Sleep(10 * time.Millisecond) // the byte is there before the wait
		}
		before := a.n
		if delay > 0 {
			close(ready)
		}
		Await(tc, &a)
		<-done
		if _, err := tc.Read(buf); err != nil {
			t.Fatal(err)
		}
		if delay == 0 {
			if a.n != before {
				t.Fatalf("message %d was there at once, yet a wait was recorded", i)
			}
			continue
		}
		if a.n != before+1 {
			t.Fatalf("message %d: %d waits recorded, want %d", i, a.n, before+1)
		}
		if g := a.gaps[before]; g < delay/2 || g > delay+2*time.Second {
			t.Fatalf("message %d sent after %s: wait recorded as %s", i, delay, g)
		}
	}
}

// TestPollLetsWokenRun: a goroutine the reader woke just before it polls
// runs during the poll, not after it. With one processor and a poll
// shorter than Go's 10 ms preemption, the woken goroutine can only run if
// the poll yields; it writes the byte the poll waits for, so a poll that
// does not yield gives up empty, every time. One that yields sees the
// byte unless the thread lost its core for the whole poll (a loaded
// machine): at least one round of five must see it.
func TestPollLetsWokenRun(t *testing.T) {
	cl, tc := tcpPair(t)
	rc, err := tc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	seen := 0
	for range 5 {
		wake := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			<-wake
			_, _ = cl.Write([]byte("x"))
		}()
		runtime.Gosched()  // the writer is now parked on wake
		wake <- struct{}{} // readies it on this processor
		var got bool
		_ = rc.Control(func(fd uintptr) { got = Poll(int(fd), 8*time.Millisecond) })
		if got {
			seen++
		}
		<-done
		if _, err := tc.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if seen == 0 {
		t.Fatal("in none of 5 rounds did the poll let the goroutine it had just woken run")
	}
}
