package rawconn

import (
	"runtime"
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

// TestAdaptiveSpinIdle: a reader under spin.Auto fed messages at a steady
// 300 us pace (longer than the base window) ends up polling long enough to
// cover the pace (at some point: a loaded machine stalls the sender now
// and then for milliseconds, and two stalls in 16 waits rightly put the
// window back to the base; the rule itself is TestAdaptiveNext's), and when the messages stop it polls once, for at most
// the cap, and then sleeps: over an idle 50 ms its thread's CPU time stays
// far below the wall time. A reader that kept polling would use about all
// of it. The bound is 50%, not the ~2% an idle machine shows (1 ms of
// polling in 50 ms): on a loaded 2-core machine the thread's wake-up and
// the scheduler's slices add CPU time, and a thread that polled throughout
// would still get at least half a core on such a machine over 50 ms, so
// the bound stays a test of the behaviour and not of the machine.
func TestAdaptiveSpinIdle(t *testing.T) {
	a, b := pair(t)
	defer func() {
		a.Shutdown()
		a.Done()
		a.Done()
		b.Done()
		b.Done()
	}()
	b.SetSpin(spin.Auto())
	const (
		steady = 64
		pace   = 300 * time.Microsecond
		idle   = 50 * time.Millisecond
	)
	type use struct{ cpu, wall time.Duration }
	uses := make(chan use, steady+2)
	windows := make(chan time.Duration, steady+3)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		buf := make([]byte, 64)
		for range steady + 2 {
			windows <- b.spin.Next()
			c0, w0 := threadCPU(t), time.Now()
			if err := b.ReadFull(buf); err != nil {
				errc <- err
				return
			}
			uses <- use{threadCPU(t) - c0, time.Since(w0)}
		}
		windows <- b.spin.Next() // after two idle stretches
		errc <- nil
	}()
	msg := make([]byte, 64)
	send := func() {
		if err := a.Writev([][]byte{msg}); err != nil {
			t.Errorf("send: %v", err)
		}
	}
	for range steady {
		// A busy wait holds the pace better than a timer on a loaded
		// machine.
		for d := time.Now().Add(pace); time.Now().Before(d); {
		}
		send()
	}
	for range 2 {
		time.Sleep(idle)
		send()
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	covered := false
	for i := range steady + 2 {
		w := <-windows
		covered = covered || w >= pace
		if w > spin.MaxWindow {
			t.Errorf("read %d polled for %s, past the cap %s", i, w, spin.MaxWindow)
		}
	}
	if !covered {
		t.Errorf("a steady %s pace never widened the window past it", pace)
	}
	if w := <-windows; w != spin.Window {
		t.Errorf("after two idle stretches the window is %s, want the base %s (waits: %v)", w, spin.Window, b.spin)
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
