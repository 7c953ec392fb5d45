package client

import (
	"net"
	"path/filepath"
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
// times each wait for a frame and widens its window to a steady pace of
// frames 300 us apart, longer than its base.
func TestAdaptiveSpinReader(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const (
		frames = 48
		pace   = 300 * time.Microsecond
	)
	frame := wire.AppendFrame(nil, &wire.Notify{Transfer: 1, Dir: wire.Push, Bytes: 4096}, false, 0)
	served := make(chan error, 1)
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		for range frames {
			// A busy wait holds the pace better than a timer on a
			// loaded machine.
			for d := time.Now().Add(pace); time.Now().Before(d); {
			}
			if _, err := c.Write(frame); err != nil {
				served <- err
				return
			}
		}
		served <- nil
	}()
	c, err := Dial(path, WithAdaptiveSpin(spin.Window, spin.MaxWindow))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	_ = c.Close() // the reader is done: its window can be read
	waits := c.rwait.Waits()
	if len(waits) < 8 {
		t.Fatalf("the reader recorded %d waits of %d frames, want most (it ended with %v)", len(waits), frames, c.err)
	}
	s := slices.Sorted(slices.Values(waits))
	if med := s[len(s)/2]; med < pace*3/4 {
		t.Fatalf("frames came %s apart; the reader's median wait is %s (%v)", pace, med, waits)
	}
	// The rule itself is spin's (TestAdaptiveNext); here: the reader
	// applies it. On a loaded machine two stalls past the cap rightly
	// leave the base.
	if s[len(s)-2] <= spin.MaxWindow && c.rwait.Next() < pace {
		t.Fatalf("a steady %s pace left the window at %s (waits %v)", pace, c.rwait.Next(), waits)
	}
}
