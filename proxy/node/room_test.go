package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/hostmem"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeHost knows one session, whose Peer is p.
type fakeHost struct {
	mu        sync.Mutex
	p         *Peer
	fallbacks map[string]int
}

func (h *fakeHost) Peer(sid [wire.SessionIDSize]byte) *Peer {
	if h.p != nil && h.p.s.Ident().ID == sid {
		return h.p
	}
	return nil
}
func (h *fakeHost) Copier() *staging.Copier { return nil }
func (h *fakeHost) Fallback(reason string) {
	h.mu.Lock()
	h.fallbacks[reason]++
	h.mu.Unlock()
}

// fakeSession is a peer session with id 1 and proof 7s.
type fakeSession struct {
	sameHost bool
	fellBack []string
}

func (s *fakeSession) Ident() Ident {
	return Ident{Name: "peer", Link: "link", ID: [wire.SessionIDSize]byte{1}, SameHost: s.sameHost, ChunkSize: 1 << 20}
}
func (s *fakeSession) Proof() (p [wire.ProofSize]byte) {
	for i := range p {
		p[i] = 7
	}
	return p
}
func (s *fakeSession) Send(wire.Msg)                                       {}
func (s *fakeSession) AcceptPush(*wire.Announce)                           {}
func (s *fakeSession) IncomingPush(uint64, bool) Incoming                  { return nil }
func (s *fakeSession) ServedPull(uint64, string, uint64, []*region.Region) {}
func (s *fakeSession) Fallback(reason string)                              { s.fellBack = append(s.fellBack, reason) }

// room serves a node socket in a fresh directory (dir: that directory,
// or a path where none can be made) for one session.
func room(t *testing.T, dir string, sameHost bool) (*Room, *fakeHost, *fakeSession) {
	t.Helper()
	return roomWith(t, dir, sameHost, nil)
}

// roomWith is room with its options changed by opt (when not nil).
func roomWith(t *testing.T, dir string, sameHost bool, opt func(*Options)) (*Room, *fakeHost, *fakeSession) {
	t.Helper()
	dv, err := hostmem.Open(0, device.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	h := &fakeHost{fallbacks: map[string]int{}}
	o := Options{Dev: dv, Log: zap.NewNop(), Dir: dir, HandshakeTimeout: 2 * time.Second, WG: &wg}
	if opt != nil {
		opt(&o)
	}
	r := Listen(h, o)
	ss := &fakeSession{sameHost: sameHost}
	h.p = r.NewPeer(ss)
	ctx, cancel := context.WithCancel(context.Background())
	r.Serve(ctx)
	t.Cleanup(func() {
		cancel()
		h.p.Shut()
		r.Close()
		wg.Wait()
		if err := r.ReleaseWake(); err != nil {
			t.Errorf("release the wake buffer: %v", err)
		}
		if err := dv.Close(); err != nil {
			t.Errorf("device close: %v", err)
		}
	})
	return r, h, ss
}

// A node connection must first prove membership of an established session
// with a peer on this node; anything else is refused with a code.
func TestNodeHello(t *testing.T) {
	good := (&fakeSession{}).Proof()
	bad := good
	bad[0]++
	for _, tc := range []struct {
		name     string
		sameHost bool
		first    wire.Msg
		want     wire.Code // CodeOK: answered OK
	}{
		{"proven", true, &wire.NodeHello{SessionID: [wire.SessionIDSize]byte{1}, Proof: good}, wire.CodeOK},
		{"unknown session", true, &wire.NodeHello{SessionID: [wire.SessionIDSize]byte{2}, Proof: good}, wire.CodeAuthFailed},
		{"wrong proof", true, &wire.NodeHello{SessionID: [wire.SessionIDSize]byte{1}, Proof: bad}, wire.CodeAuthFailed},
		{"peer on another node", false, &wire.NodeHello{SessionID: [wire.SessionIDSize]byte{1}, Proof: good}, wire.CodeAccessDenied},
		{"not a NodeHello", true, &wire.OK{}, wire.CodeMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			r, _, _ := room(t, dir, tc.sameHost)
			if r.Name() == "" {
				t.Fatal("no node socket served")
			}
			c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: filepath.Join(dir, r.Name()), Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			if err := unixsock.WriteFrame(c, tc.first, -1); err != nil {
				t.Fatal(err)
			}
			_, m, fd, _, err := unixsock.ReadFrame(c, nil)
			unixsock.CloseFD(fd)
			if err != nil {
				t.Fatal(err)
			}
			got := wire.CodeOK
			if f, ok := m.(*wire.Fail); ok {
				got = f.Code
			} else if _, ok := m.(*wire.OK); !ok {
				t.Fatalf("answer is %s, want OK or Fail", m.Type())
			}
			if got != tc.want {
				t.Fatalf("answered %s, want %s", got, tc.want)
			}
		})
	}
}

// Choose says why a same-node path cannot be used, and NoteFallback counts
// it on the session and in the metrics, stopping the path for good after
// a failure that would repeat.
func TestChooseAndFallback(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		dir      string // "": a fresh directory
		sameHost bool
		info     *wire.NodeInfo // nil: none arrived
		want     string
		dir2     wire.Direction
		t        Transport
		reason   string
	}{
		{"another node", "", false, nil, "auto", wire.Push, TCP, ""},
		{"route asks tcp", "", true, nil, "tcp", wire.Push, TCP, ""},
		{"no node socket of ours", file, true, &wire.NodeInfo{Socket: "x", Device: "hostmem:0"}, "auto", wire.Push, TCP, fbNoNodeSocket},
		{"peer offers none", "", true, &wire.NodeInfo{Device: "hostmem:0"}, "auto", wire.Push, TCP, fbPeerNoSocket},
		{"same kind", "", true, &wire.NodeInfo{Socket: "x", Device: "hostmem:1"}, "auto", wire.Push, IPC, ""},
		{"kinds differ, auto", "", true, &wire.NodeInfo{Socket: "x", Device: "cuda:0"}, "auto", wire.Push, Shm, ""},
		{"kinds differ, ipc", "", true, &wire.NodeInfo{Socket: "x", Device: "cuda:0"}, "ipc", wire.Push, TCP, fbDeviceMismatch},
		{"shm pull", "", true, &wire.NodeInfo{Socket: "x", Device: "hostmem:0"}, "shm", wire.Pull, TCP, fbShmPull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.dir
			if dir == "" {
				dir = t.TempDir()
			}
			_, h, ss := room(t, dir, tc.sameHost)
			if tc.info != nil {
				h.p.SetInfo(tc.info)
			} else if tc.sameHost {
				h.p.SetInfo(&wire.NodeInfo{Socket: "x", Device: "hostmem:0"})
			}
			got, err := h.p.Choose(tc.want, tc.dir2)
			var fb *fallbackError
			if reason := ""; errors.As(err, &fb) {
				reason = fb.reason
				if reason != tc.reason {
					t.Fatalf("fallback %q (%v), want %q", reason, err, tc.reason)
				}
			} else if err != nil || tc.reason != "" {
				t.Fatalf("error %v, want fallback %q", err, tc.reason)
			}
			if got != tc.t {
				t.Fatalf("transport %s, want %s", got, tc.t)
			}
			if fell := h.p.NoteFallback(err); fell != (tc.reason != "") {
				t.Fatalf("NoteFallback says fallback %v, want %v: the caller starts TCP on it", fell, tc.reason != "")
			}
			if n := len(ss.fellBack); (tc.reason != "") != (n == 1) || h.fallbacks[tc.reason] != n {
				t.Fatalf("counted %v on the session and %v in metrics, want reason %q once", ss.fellBack, h.fallbacks, tc.reason)
			}
		})
	}
	// What a same-node Push or Pull returned: only a fallback (wrapped or
	// not) sends the transfer to TCP; any other error, or none, ends it.
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"none", nil, false},
		{"a device error", status.Errorf(wire.CodeDevice, "copy failed"), false},
		{"a fallback", Fallback(fbPeerUnreachable, errors.New("dial")), true},
		{"a wrapped fallback", fmt.Errorf("push 3: %w", Fallback(fbShmSetup, errors.New("pin"))), true},
	} {
		t.Run("run returned "+tc.name, func(t *testing.T) {
			_, h, ss := room(t, t.TempDir(), true)
			if got := h.p.NoteFallback(tc.err); got != tc.want {
				t.Fatalf("NoteFallback(%v) = %v, want %v", tc.err, got, tc.want)
			}
			if n := len(ss.fellBack); (n == 1) != tc.want {
				t.Fatalf("counted %v on the session, want one only for a fallback", ss.fellBack)
			}
		})
	}
	t.Run("import failures stop the path", func(t *testing.T) {
		_, h, _ := room(t, t.TempDir(), true)
		h.p.SetInfo(&wire.NodeInfo{Socket: "x", Device: "hostmem:0"})
		h.p.NoteFallback(Fallback(fbImportFailed, errors.New("refused")))
		_, err := h.p.Choose("auto", wire.Push)
		var fb *fallbackError
		if !errors.As(err, &fb) || fb.reason != fbImportFailed {
			t.Fatalf("after an import failure Choose says %v, want fallback %q", err, fbImportFailed)
		}
	})
}
