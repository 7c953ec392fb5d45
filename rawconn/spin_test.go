package rawconn

import (
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/internal/spin"
)

// threadCPU is the CPU time of the calling thread.
func threadCPU(t *testing.T) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		t.Errorf("getrusage(RUSAGE_THREAD): %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestAdaptiveSpinIdle: a reader under spin.Auto times its waits for
// messages and applies the adaptive rule to them, and when the messages
// stop it polls once, for at most the cap, and then sleeps.
//
// Each message of the steady phase goes out a 300 us pace after the
// reader took the last one, so each is a wait of about the pace. What the
// reader's window then is depends on how steady the machine kept that
// pace (a loaded machine stalls threads for milliseconds, and two stalls
// in 16 waits rightly keep the base), so the test does not assert a
// window: it asserts that the reader timed its waits and that its window
// is the rule's for those waits (spin.Policy.WindowAfter; the rule itself
// is TestAdaptiveNext's). Over each idle 50 ms the reader's thread must
// use far less CPU than the wall time: a reader that kept polling would
// use about all of it. The bound is 50%, not the ~2% an idle machine shows
// (1 ms of polling in 50 ms): on a loaded 2-core machine the thread's
// wake-up and the scheduler's slices add CPU time, and a thread that
// polled throughout would still get at least half a core over 50 ms.
func TestAdaptiveSpinIdle(t *testing.T) {
	a, b := pair(t)
	defer closePair(a, b, 2)
	b.SetSpin(spin.Auto())
	const (
		steady = 64
		pace   = 300 * time.Microsecond
		idle   = 50 * time.Millisecond
	)
	type use struct{ cpu, wall time.Duration }
	type state struct {
		waits []time.Duration
		win   time.Duration
	}
	uses := make(chan use, steady+2)
	windows := make(chan time.Duration, steady+2)
	took := make(chan struct{}, 1) // the reader has taken a message
	after := make(chan state, 2)   // after the steady phase, and after the idle one
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		buf := make([]byte, 64)
		for i := range steady + 2 {
			if i == steady {
				after <- state{b.spin.Waits(), b.spin.Next()}
			}
			windows <- b.spin.Next()
			c0, w0 := threadCPU(t), time.Now()
			if err := b.ReadFull(buf); err != nil {
				errc <- err
				return
			}
			uses <- use{threadCPU(t) - c0, time.Since(w0)}
			took <- struct{}{}
		}
		after <- state{b.spin.Waits(), b.spin.Next()}
		errc <- nil
	}()
	msg := make([]byte, 64)
	send := func() {
		if err := a.Writev([][]byte{msg}); err != nil {
			t.Errorf("send: %v", err)
		}
	}
	for i := range steady {
		if i > 0 {
			<-took
		}
		// A busy wait holds the pace better than a timer on a loaded
		// machine.
		for d := time.Now().Add(pace); time.Now().Before(d); {
		}
		send()
	}
	for range 2 {
		<-took
		time.Sleep(idle)
		send()
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	for i := range steady + 2 {
		if w := <-windows; w > spin.MaxWindow {
			t.Errorf("read %d polled for %s, past the cap %s", i, w, spin.MaxWindow)
		}
	}
	st := <-after
	if len(st.waits) < 4 {
		t.Fatalf("the reader timed %d waits of %d messages sent after it took the last", len(st.waits), steady)
	}
	long := len(slices.DeleteFunc(slices.Clone(st.waits), func(d time.Duration) bool { return d < pace/2 }))
	if long < len(st.waits)/2 {
		t.Errorf("messages came %s after the reader took the last; most of its waits are shorter than half that: %v", pace, st.waits)
	}
	if want := spin.Auto().WindowAfter(st.waits...); st.win != want {
		t.Errorf("after waits %v the window is %s, the rule gives %s", st.waits, st.win, want)
	}
	if st := <-after; st.win != spin.Window {
		t.Errorf("after two idle stretches the window is %s, want the base %s (waits: %v)", st.win, spin.Window, st.waits)
	}
	for range steady {
		<-uses
	}
	for i := range 2 {
		u := <-uses
		t.Logf("idle stretch %d: %s CPU over %s", i+1, u.cpu, u.wall)
		if u.wall < idle/5 {
			t.Errorf("idle stretch %d lasted only %s: the reader was late, nothing measured", i+1, u.wall)
		}
		if u.cpu > u.wall/2 {
			t.Errorf("idle stretch %d: the reader's thread used %s CPU in %s: it kept polling", i+1, u.cpu, u.wall)
		}
	}
}

// TestPollLetsWokenRun: a goroutine the reader woke just before it polls
// runs during the poll (spin.YieldFirst). With one processor and a poll
// shorter than Go's 10 ms preemption, the woken goroutine can only run if
// the poll yields; it writes what the poll waits for, so a poll that does
// not yield gives up empty, every time. One that yields sees the write
// unless the thread lost its core for the whole poll (a loaded machine):
// at least one round of five must see it.
func TestPollLetsWokenRun(t *testing.T) {
	a, b := pair(t)
	defer closePair(a, b, 2)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	buf := make([]byte, 1)
	seen := 0
	for i := range 5 {
		wake := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			<-wake
			_ = a.Writev([][]byte{{byte(i)}})
		}()
		runtime.Gosched()  // the writer is now parked on wake
		wake <- struct{}{} // readies it on this processor
		n, _, err := b.poll(buf, 8*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		<-done
		if n == 0 { // the byte is read by the next round's poll
			if err := b.ReadFull(buf); err != nil {
				t.Fatal(err)
			}
		} else {
			seen++
		}
	}
	if seen == 0 {
		t.Fatal("in none of 5 rounds did the poll let the goroutine it had just woken run")
	}
}
