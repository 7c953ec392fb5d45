package client

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/wire"
)

// TestDueBook: a Do is due by the pace of the last Do that moved its bytes
// on the same route and peer; failures and empty transfers teach nothing,
// and the reader waits for the earliest answer due.
func TestDueBook(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	var b dueBook
	b.expect(1, "r\x00", 1000, t0)
	if d := b.next(); d != (spin.Due{}) {
		t.Fatalf("no pace yet, but due %+v", d)
	}
	b.settle(1, "r\x00", 1000, t0, t0.Add(5*ms), false) // failed: teaches nothing
	b.settle(2, "r\x00", 0, t0, t0.Add(5*ms), true)     // no bytes: nothing
	b.expect(3, "r\x00", 1000, t0)
	if d := b.next(); d != (spin.Due{}) {
		t.Fatalf("a failure or an empty transfer set a pace: due %+v", d)
	}
	b.settle(3, "r\x00", 1000, t0, t0.Add(2*ms), true) // 2 us a byte
	t1 := t0.Add(time.Second)
	b.expect(4, "r\x00", 4000, t1)         // due in 8 ms
	b.expect(5, "r\x00", 1000, t1.Add(ms)) // due in 1+2 ms: first
	b.expect(6, "other\x00", 1000, t1)     // no pace on this route
	if d, want := b.next(), (spin.Due{Start: t1.Add(ms), Expect: 2 * ms}); d != want {
		t.Fatalf("next %+v, want the earliest %+v", d, want)
	}
	b.settle(5, "r\x00", 1000, t1.Add(ms), t1.Add(4*ms), true) // 3 us a byte now
	if d, want := b.next(), (spin.Due{Start: t1, Expect: 8 * ms}); d != want {
		t.Fatalf("next %+v, want %+v", d, want)
	}
	b.expect(7, "r\x00", 1000, t1)
	if d := b.open[7]; d.Expect != 3*ms {
		t.Fatalf("a later Do is due by the last pace: %+v, want 3ms", d)
	}
	b.answered(7) // the reader has its answer: no more polling for it
	if d, want := b.next(), (spin.Due{Start: t1, Expect: 8 * ms}); d != want {
		t.Fatalf("after 7's answer next is %+v, want %+v", d, want)
	}
	b.settle(4, "r\x00", 4000, t1, t1, true) // answered at once: no pace from it
	if b.pace["r\x00"] != 3000 {
		t.Fatalf("pace %v, want 3000 ns/B", b.pace["r\x00"])
	}
	// Bounded: past maxPaces routes the book starts over.
	for i := range maxPaces + 1 {
		b.settle(0, string(rune('a'+i%26))+string(rune(i)), 1, t0, t0.Add(ms), true)
	}
	if len(b.pace) > maxPaces {
		t.Fatalf("%d paces kept, want at most %d", len(b.pace), maxPaces)
	}
}

func TestMoved(t *testing.T) {
	for _, tc := range []struct {
		a    wire.Msg
		want bool
	}{
		{&wire.XferStatus{State: wire.StateDone}, true},
		{&wire.XferStatus{State: wire.StateFailed}, false},
		{&wire.Fail{}, false},
		{nil, false},
	} {
		if got := moved(tc.a); got != tc.want {
			t.Errorf("moved(%#v) = %v, want %v", tc.a, got, tc.want)
		}
	}
}

// TestDoDue: Do calls whose answers come 20 ms after each request, on a
// client that polls: from the second on, the reader is woken to plan for
// the answer (due by the first's pace) and sleeps until it is due; every
// answer reaches its caller, and Close returns at once with the reader
// asleep.
func TestDoDue(t *testing.T) {
	path, ln := listenSidecar(t)
	served := serveOne(ln, func(c *net.UnixConn) error {
		var buf []byte
		for {
			_, m, b, err := wire.ReadFrame(c, buf)
			if err != nil {
				return nil // the client closed
			}
			buf = b
			sw, ok := m.(*wire.SubmitWait)
			if !ok {
				return fmt.Errorf("got %s, want SubmitWait", m.Type())
			}
			time.Sleep(20 * time.Millisecond)
			a := &wire.XferStatus{Req: sw.Req, Transfer: sw.Req, State: wire.StateDone, Done: 1 << 20, Total: 1 << 20}
			if _, err := c.Write(wire.AppendFrame(nil, a, false, 0)); err != nil {
				return err
			}
		}
	})
	cl, err := Dial(path, WithSpin(100*time.Microsecond))
	if err != nil {
		t.Fatal(err)
	}
	tr := Transfer{Route: "r", Dir: wire.Push, LocalNames: []string{"a"}, RemoteNames: []string{"b"},
		Ops: []wire.LocalOp{{Len: 1 << 20}}}
	for i := range 4 {
		st, err := cl.Do(context.Background(), tr)
		if err != nil || st.State != wire.StateDone {
			t.Fatalf("Do %d: %+v, %v", i, st, err)
		}
		cl.dues.mu.Lock()
		pace, open := cl.dues.pace[paceKey(&tr)], len(cl.dues.open)
		cl.dues.mu.Unlock()
		if pace <= 0 || open != 0 {
			t.Fatalf("after Do %d: pace %v ns/B, %d answers still due; want a pace and none", i, pace, open)
		}
	}
	time.Sleep(5 * time.Millisecond) // the reader is asleep
	t0 := time.Now()
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	// The reader's sleep lasts a second between checks; Close wakes it.
	if el := time.Since(t0); el > 500*time.Millisecond {
		t.Fatalf("Close took %v: it waited out the reader's sleep", el)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}
