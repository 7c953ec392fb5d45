package proxy

import (
	"crypto/tls"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/stage-kv/stage/config"
)

// ctxConn is a gnet connection whose context is a session; nothing else
// of it is used.
type ctxConn struct {
	gnet.Conn
	ss *session
}

func (c ctxConn) Context() any { return c.ss }

// closeWaiting reports whether a goroutine is in closerGroup.wait:
// Close waits for the sessions it closes on goroutines of their own.
func closeWaiting() bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "proxy.(*closerGroup).wait")
}

// The three places that close a session on a goroutine of its own (gnet's
// OnClose, a control backlog past its bound, a failed control write) do
// it inside what Close waits for: while such a close is under way (held
// here by the session's lock), Close does not return, and after it
// returns no goroutine of the sidecar is left.
func TestCloseWaitsForSessionsClosing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(s *Server, ss *session)
	}{
		{"gnet closed the control connection", func(s *Server, ss *session) {
			(&ctrlHandler{s: s}).OnClose(ctxConn{ss: ss}, nil)
		}},
		{"control backlog past its bound", func(s *Server, ss *session) {
			tc := &tlsControl{ss: ss, kick: make(chan struct{}, 1), done: make(chan struct{})}
			tc.write(make([]byte, maxCtlBacklog+1))
		}},
		{"control write failed", func(s *Server, ss *session) {
			a, b := net.Pipe()
			_, _ = a.Close(), b.Close()
			tc := &tlsControl{ss: ss, c: tls.Client(a, &tls.Config{ServerName: "peer"}), kick: make(chan struct{}, 1), done: make(chan struct{})}
			tc.buf = []byte("frame")
			s.wg.Add(1)
			go tc.writeLoop()
			tc.kick <- struct{}{}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			noLeaks(t)
			s := startTestSidecar(t, "closer", config.TLS{}, "").Server
			ss := s.newSession(true, 1)
			ss.mu.Lock() // the close started below waits for this
			locked := true
			defer func() {
				if locked {
					ss.mu.Unlock()
				}
			}()
			tc.start(s, ss)
			closed := make(chan error, 1)
			go func() { closed <- s.Close() }()
			for !closeWaiting() {
				select {
				case <-closed:
					t.Fatal("Close returned while a session it closes was still closing")
				default:
				}
				time.Sleep(time.Millisecond)
			}
			ss.mu.Unlock()
			locked = false
			if err := <-closed; err != nil {
				t.Fatal(err)
			}
			select {
			case <-ss.done:
			default:
				t.Fatal("Close returned before the session closed")
			}
		})
	}
}
