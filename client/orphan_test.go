package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stage-kv/stage/wire"
)

// A transfer whose Submitted comes after its submit's context ended is
// cancelled: its caller gave up on it and may have reused the memory (a
// decode engine that gave up on a pull recomputes into those blocks). One
// answered in time is not.
func TestLateSubmittedIsCancelled(t *testing.T) {
	for _, late := range []bool{true, false} {
		t.Run(fmt.Sprintf("late=%v", late), func(t *testing.T) {
			path, ln := listenSidecar(t)
			gaveUp := make(chan struct{})
			cancelled := make(chan uint64, 1)
			served := serveOne(ln, func(c *net.UnixConn) error {
				r := bufio.NewReader(c)
				_, m, _, err := wire.ReadFrame(r, nil)
				if err != nil {
					return err
				}
				kv, ok := m.(*wire.SubmitKV)
				if !ok {
					return fmt.Errorf("got %T, want SubmitKV", m)
				}
				if late {
					<-gaveUp
				}
				if _, err := c.Write(wire.AppendFrame(nil, &wire.Submitted{Req: kv.Req, Transfer: 91}, false, 0)); err != nil {
					return err
				}
				for {
					_, m, _, err = wire.ReadFrame(r, nil)
					if err != nil {
						return nil // the client closed: no Cancel came
					}
					if x, ok := m.(*wire.Cancel); ok {
						cancelled <- x.Transfer
						// the test may close the client as soon as it saw the Cancel
						_, _ = c.Write(wire.AppendFrame(nil, &wire.OK{Req: x.Req}, false, 0))
						return nil
					}
				}
			})
			c, err := Dial(path, WithSpin(0))
			if err != nil {
				t.Fatal(err)
			}
			timeout := 5 * time.Second
			if late {
				timeout = 50 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			_, err = c.SubmitKV(ctx, wire.SubmitKV{Route: "r", Dir: wire.Pull, Local: "a", Remote: "b", Tokens: 1})
			cancel()
			close(gaveUp)
			if late {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("the submit answered late: %v, want its deadline", err)
				}
				select {
				case id := <-cancelled:
					if id != 91 {
						t.Fatalf("cancelled transfer %d, want 91", id)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("the transfer started after its submit gave up was not cancelled")
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)
				if len(cancelled) != 0 {
					t.Fatalf("a transfer answered in time was cancelled (%d)", <-cancelled)
				}
			}
			_ = c.Close()
			if err := <-served; err != nil {
				t.Fatal(err)
			}
		})
	}
}
