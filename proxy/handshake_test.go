package proxy

import (
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/wire"
)

// failingConn fails every Write after the first ok ones.
type failingConn struct {
	net.Conn
	ok     int32
	writes atomic.Int32
}

func (c *failingConn) Write(b []byte) (int, error) {
	if c.writes.Add(1) > c.ok {
		return 0, errors.New("injected write failure")
	}
	return c.Conn.Write(b)
}

// An accepted session whose Welcome cannot be written is undone: it was
// made known (to acceptData and the core) before Welcome, so it must be
// gone from both maps afterwards and closed.
func TestAcceptSessionWelcomeFails(t *testing.T) {
	ts := startTestSidecar(t, "welcome", config.TLS{}, "")
	s := ts.Server
	server, client := net.Pipe()
	defer client.Close()
	var nc [wire.NonceSize]byte
	nc[0] = 7
	hello := &wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, NodeName: "peer", HostID: "elsewhere",
		Nonce: nc, SlotSize: 256 << 10, Window: 4}
	go func() { // the dialer: read the Challenge, prove the token
		_, m, _, err := wire.ReadFrame(client, nil)
		ch, ok := m.(*wire.Challenge)
		if err != nil || !ok {
			return
		}
		_, _ = client.Write(wire.AppendFrame(nil, &wire.Auth{Proof: proof(s.token, "stage-client", nc[:], ch.Nonce[:])}, false, 0))
	}()
	err := handshaker{s}.acceptSession(&failingConn{Conn: server, ok: 1}, hello) // the Challenge goes out, the Welcome does not
	if err == nil || !strings.Contains(err.Error(), "send welcome") {
		t.Fatalf("acceptSession: got %v, want the Welcome's write error", err)
	}
	s.sessions.mu.Lock()
	left := s.sessions.allLocked()
	s.sessions.mu.Unlock()
	if len(left) > 0 {
		t.Fatalf("%d sessions left in the maps after a failed Welcome (closed: %v)", len(left), left[0].closed)
	}
	// Closed like any session: the core heard EvSessionDown, and the log
	// says why.
	ts.waitLog(t, "session down")
	ts.waitLog(t, "send welcome")
}
