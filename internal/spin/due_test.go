package spin

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDuePlan: a reader sleeps until a little before a message is due and
// polls through the due time; with nothing due it waits as before.
func TestDuePlan(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	for _, tc := range []struct {
		name        string
		d           Due
		at          time.Duration // since Start
		sleep, poll time.Duration
	}{
		{"nothing due", Due{}, 0, 0, 0},
		{"no expected wait", Due{Start: t0}, 0, 0, 0},
		// 11 ms, lead max(500us, 11ms/16 = 687.5us): sleep to 10.3125 ms,
		// poll 1.375 ms through the due time and as much after.
		{"11 ms", Due{t0, 11 * ms}, 0, 10312500 * time.Nanosecond, 1375 * time.Microsecond},
		{"asked later: sleeps less", Due{t0, 11 * ms}, 5 * ms, 5312500 * time.Nanosecond, 1375 * time.Microsecond},
		{"past the wake-up: polls what is left", Due{t0, 11 * ms}, 11 * ms, 0, 687500 * time.Nanosecond},
		{"past the end: as before", Due{t0, 11 * ms}, 20 * ms, 0, 0},
		{"2.75 ms: the lead is DueLead", Due{t0, 2750 * time.Microsecond}, 0, 2250 * time.Microsecond, ms},
		{"too short to sleep: polled from the start", Due{t0, 172 * time.Microsecond}, 0, 0, 672 * time.Microsecond},
		{"176 ms: the poll is capped", Due{t0, 176 * ms}, 0, 165 * ms, DueSpinMax},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sleep, poll := tc.d.Plan(t0.Add(tc.at))
			if sleep != tc.sleep || poll != tc.poll {
				t.Errorf("Plan = sleep %v, poll %v; want %v, %v", sleep, poll, tc.sleep, tc.poll)
			}
		})
	}
}

// TestSleepReadable: the sleep ends when a message comes (one earlier than
// foreseen is not held until the due time), and times out when none does.
func TestSleepReadable(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if SleepReadable(fds[0], 2*time.Millisecond) {
		t.Fatal("readable with nothing sent")
	}
	go func() {
		time.Sleep(time.Millisecond)
		_, _ = unix.Write(fds[1], []byte("x"))
	}()
	start := time.Now()
	if !SleepReadable(fds[0], 20*time.Second) {
		t.Fatal("not readable after the write")
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("the sleep ran out (%v) instead of ending at the write", el)
	}
}

// TestAwaitDueClosed: a reader asleep for a message due far ahead notices
// its connection closed within a slice, not at the due time.
func TestAwaitDueClosed(t *testing.T) {
	_, tc := tcpPair(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		AwaitDue(tc, 30*time.Second, DueSpinMax)
	}()
	time.Sleep(5 * time.Millisecond)
	tc.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("AwaitDue still asleep 10 s after its connection closed")
	}
}

// TestAwaitOr: a reader asleep after its poll returns for bytes (not
// kicked), for a kick (to plan again; the kick is taken), and at once on
// a closed connection; a Wake after Close does nothing.
func TestAwaitOr(t *testing.T) {
	cl, tc := tcpPair(t)
	k, err := NewKick()
	if err != nil {
		t.Fatal(err)
	}
	a := Fixed(100 * time.Microsecond).New()
	go func() {
		time.Sleep(5 * time.Millisecond)
		_, _ = cl.Write([]byte("x"))
	}()
	if AwaitOr(tc, &a, k) {
		t.Fatal("bytes came, but AwaitOr says it was kicked")
	}
	if _, err := tc.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	k.Wake()
	k.Wake() // two before the reader looks: one wake-up
	if !AwaitOr(tc, &a, k) {
		t.Fatal("kicked, but AwaitOr says bytes came")
	}
	go func() {
		time.Sleep(5 * time.Millisecond)
		_, _ = cl.Write([]byte("y"))
	}()
	if AwaitOr(tc, &a, k) {
		t.Fatal("the kick was not taken: AwaitOr woke for it again")
	}
	tc.Close()
	if AwaitOr(tc, &a, k) {
		t.Fatal("a closed connection reads as a kick")
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	k.Wake()
	if err := k.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestPace: a pace is learned only from bytes answered after some time,
// and gives a due time only with a pace, a start and bytes.
func TestPace(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		el   time.Duration
		n    uint64
		want Pace
	}{
		{2 * time.Millisecond, 1000, 2000},
		{0, 1000, 0},
		{-time.Millisecond, 1000, 0},
		{time.Millisecond, 0, 0},
	} {
		if got := PaceOf(tc.el, tc.n); got != tc.want {
			t.Errorf("PaceOf(%v, %d) = %v, want %v", tc.el, tc.n, got, tc.want)
		}
	}
	for _, tc := range []struct {
		p     Pace
		start time.Time
		n     uint64
		want  Due
	}{
		{2000, t0, 4000, Due{t0, 8 * time.Millisecond}},
		{0, t0, 4000, Due{}},
		{2000, time.Time{}, 4000, Due{}},
		{2000, t0, 0, Due{}},
	} {
		if got := tc.p.Due(tc.start, tc.n); got != tc.want {
			t.Errorf("Pace(%v).Due(%v, %d) = %+v, want %+v", tc.p, tc.start, tc.n, got, tc.want)
		}
	}
}
