package client

import (
	"net"
	"slices"
	"testing"
	"time"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/wire"
)

func TestSpinOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		want spin.Policy
	}{
		{"default", nil, spin.DefaultPolicy()},
		{"WithSpin(0) never polls", []Option{WithSpin(0)}, spin.Policy{}},
		{"WithSpin fixed", []Option{WithSpin(50 * time.Microsecond)}, spin.Fixed(50 * time.Microsecond)},
		{"WithAdaptiveSpin", []Option{WithAdaptiveSpin(spin.Window, spin.MaxWindow)}, spin.Auto()},
		{"limit below base: fixed", []Option{WithAdaptiveSpin(200*time.Microsecond, 100*time.Microsecond)}, spin.Fixed(200 * time.Microsecond)},
		{"the last option wins", []Option{WithAdaptiveSpin(spin.Window, spin.MaxWindow), WithSpin(0)}, spin.Policy{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Client{spin: spin.DefaultPolicy()}
			for _, o := range tc.opts {
				o(c)
			}
			if c.spin != tc.want {
				t.Fatalf("policy %s, want %s", c.spin, tc.want)
			}
		})
	}
}

// TestAdaptiveSpinReader: the client's reader, under WithAdaptiveSpin,
// times each wait for a frame and applies the adaptive rule to those
// waits. Each frame goes out a 300 us pace after the client took the last
// one from its notification channel, so each is a wait of about the pace;
// the window that gives depends on how steady a loaded machine kept it,
// so the test checks the rule was applied to the waits the reader timed
// (spin.Policy.WindowAfter), not a window (the rule is spin's
// TestAdaptiveNext).
func TestAdaptiveSpinReader(t *testing.T) {
	path, ln := listenSidecar(t)
	const (
		frames = 48
		pace   = 300 * time.Microsecond
	)
	frame := wire.AppendFrame(nil, &wire.Notify{Transfer: 1, Dir: wire.Push, Bytes: 4096}, false, 0)
	took := make(chan struct{}, 1) // the client took the last frame
	served := serveOne(ln, func(c *net.UnixConn) error {
		for i := range frames {
			if i > 0 {
				<-took
			}
			// A busy wait holds the pace better than a timer on a
			// loaded machine.
			for d := time.Now().Add(pace); time.Now().Before(d); {
			}
			if _, err := c.Write(frame); err != nil {
				return err
			}
		}
		return nil
	})
	c, err := Dial(path, WithAdaptiveSpin(spin.Window, spin.MaxWindow))
	if err != nil {
		t.Fatal(err)
	}
	for i := range frames {
		select {
		case <-c.notify:
			took <- struct{}{}
		case <-time.After(10 * time.Second):
			t.Fatalf("frame %d of %d did not come", i+1, frames)
		}
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	_ = c.Close() // the reader is done: its window can be read
	waits := c.rwait.Waits()
	if len(waits) < 4 {
		t.Fatalf("the reader timed %d waits of %d frames sent after the client took the last (it ended with %v)", len(waits), frames, c.err)
	}
	long := len(slices.DeleteFunc(slices.Clone(waits), func(d time.Duration) bool { return d < pace/2 }))
	if long < len(waits)/2 {
		t.Fatalf("frames came %s after the client took the last; most of its reader's waits are shorter than half that: %v", pace, waits)
	}
	if want := spin.Auto().WindowAfter(waits...); c.rwait.Next() != want {
		t.Fatalf("after waits %v the window is %s, the rule gives %s", waits, c.rwait.Next(), want)
	}
}
