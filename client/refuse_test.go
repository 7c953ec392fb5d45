package client

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stage-kv/stage/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A sidecar that refuses a connection (issue 35, item 4) writes a Fail
// with Req 0 saying why and closes it. Whether the client's first request
// still went out (the reader takes the Fail) or met the closed socket (a
// broken pipe), the call fails with the sidecar's reason as an *Error.
func TestRefusalReasonSurfaces(t *testing.T) {
	path, ln := listenSidecar(t)
	const why = "the sidecar has limits.max_clients (1) control connections open"
	refusal := wire.AppendFrame(nil, &wire.Fail{Code: wire.CodeBusy, Message: why}, false, 0)
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			_, _ = c.Write(refusal)
			_ = c.Close()
		}
	}()
	for i := range 40 {
		c, err := Dial(path, WithSpin(0))
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			time.Sleep(time.Millisecond) // let the refusal land first, on some tries
		}
		_, err = c.Stats(context.Background())
		if CodeOf(err) != wire.CodeBusy || !strings.Contains(err.Error(), why) {
			t.Fatalf("try %d: got %v, want the sidecar's reason (busy: %s)", i, err, why)
		}
		_ = c.Close()
	}
	_ = ln.Close()
	<-served
}

// listenSidecar listens on a Unix socket in a temporary directory, as a
// sidecar's control socket for a test to play; closed when the test ends.
func listenSidecar(t *testing.T) (string, *net.UnixListener) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return path, ln
}

// serveOne plays the sidecar for the first connection to ln with serve,
// closes it, and reports serve's error on the channel.
func serveOne(ln *net.UnixListener, serve func(c *net.UnixConn) error) <-chan error {
	served := make(chan error, 1)
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		served <- serve(c)
	}()
	return served
}
