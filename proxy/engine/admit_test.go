package engine

import (
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// serveAdmit runs a listener of max clients that refuses a connection
// silent for firstReq.
func serveAdmit(t *testing.T, max int, firstReq time.Duration) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s", "c.sock")
	l, err := Listen(path, fakeBackend{done: make(chan struct{})}, zap.NewNop(), Options{MaxClients: max, FirstRequestTimeout: firstReq})
	if err != nil {
		t.Fatal(err)
	}
	l.Serve()
	t.Cleanup(l.Close)
	return path
}

// wantRefused reads what a refused connection gets: a Fail with Req 0,
// code and a message containing want, then the end of the connection.
func wantRefused(t *testing.T, what string, c *net.UnixConn, code wire.Code, want string) {
	t.Helper()
	m := readMsg(t, c)
	if f, ok := m.(*wire.Fail); !ok || f.Req != 0 || f.Code != code || !strings.Contains(f.Message, want) {
		t.Fatalf("%s: got %#v, want Fail{Req 0, %v} saying %q", what, m, code, want)
	}
	if _, _, _, _, err := unixsock.ReadFrame(c, nil); !errors.Is(err, io.EOF) {
		t.Fatalf("%s: after the Fail got %v, want the connection closed", what, err)
	}
}

// wantServed sends a Query on c and wants it answered.
func wantServed(t *testing.T, what string, c *net.UnixConn, req uint64) {
	t.Helper()
	if err := unixsock.WriteFrame(c, &wire.Query{Req: req, What: wire.QueryStats}, -1); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if m, ok := readMsg(t, c).(*wire.QueryReply); !ok || m.Req != req {
		t.Fatalf("%s: Query answered %#v, want a QueryReply", what, m)
	}
}

// Issue 35, item 4: connections that never send a request cannot hold
// every slot. One past limits.max_clients is told so; silent ones are told
// they sent nothing in time and closed, which frees their slots; one that
// asked something at once is served however long it idles afterwards.
func TestSilentConnectionsRefused(t *testing.T) {
	const firstReq = 300 * time.Millisecond
	path := serveAdmit(t, 4, firstReq)
	talker := dial(t, path)
	wantServed(t, "a client that asks at once", talker, 1)
	silent := []*net.UnixConn{dial(t, path), dial(t, path), dial(t, path)}
	over := dial(t, path)
	wantRefused(t, "a connection past max_clients", over, wire.CodeBusy, "limits.max_clients (4)")
	start := time.Now()
	for i, c := range silent {
		wantRefused(t, "a silent connection", c, wire.CodeTimeout, "limits.client_first_request_timeout (300ms)")
		if d := time.Since(start); i == 0 && d < firstReq/2 {
			t.Fatalf("a silent connection refused after %v, before limits.client_first_request_timeout (%v)", d, firstReq)
		}
	}
	wantServed(t, "a new client once the silent ones are gone", dial(t, path), 2)
	wantServed(t, "the first client after idling past the timeout", talker, 3)
}

// A connection whose first frame carries an fd is served with the fd: the
// wait for the first request consumes nothing.
func TestFirstRequestKeptWhole(t *testing.T) {
	path := serveAdmit(t, 2, time.Minute)
	c := dial(t, path)
	time.Sleep(50 * time.Millisecond) // the listener waits on this connection first
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unixsock.CloseFD(p[0])
	defer unixsock.CloseFD(p[1])
	if err := unixsock.WriteFrame(c, &wire.Register{Req: 1, Name: "a"}, p[0]); err != nil {
		t.Fatal(err)
	}
	if m, ok := readMsg(t, c).(*wire.OK); !ok || m.Req != 1 {
		t.Fatalf("Register with an fd answered %#v, want OK (a frame flagged FD whose fd was lost is refused)", m)
	}
}
