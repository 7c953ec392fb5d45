package netns

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/wire"
)

// dialFrom opens a TCP connection to addr from inside network namespace
// ns: a thread of its own enters ns, makes the socket (which stays in ns
// for good) and comes back. A thread that cannot come back is not handed
// back to the runtime: its goroutine ends locked to it, and the thread
// with it.
func dialFrom(ns, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		c, back, err := dialIn(ns, addr)
		if back {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// dialIn is dialFrom's work, on a locked thread; back reports whether the
// thread is in its own namespace again.
func dialIn(ns, addr string) (c net.Conn, back bool, err error) {
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, true, fmt.Errorf("open this thread's network namespace: %w", err)
	}
	defer self.Close()
	target, err := os.Open(filepath.Join("/run/netns", ns))
	if err != nil {
		return nil, true, fmt.Errorf("open namespace %s: %w", ns, err)
	}
	defer target.Close()
	if err := setns(target); err != nil {
		return nil, true, fmt.Errorf("enter namespace %s: %w", ns, err)
	}
	c, err = net.DialTimeout("tcp", addr, 5*time.Second)
	if rerr := setns(self); rerr != nil {
		if c != nil {
			_ = c.Close()
		}
		return nil, false, fmt.Errorf("leave namespace %s: %w", ns, rerr)
	}
	if err != nil {
		return nil, true, fmt.Errorf("dial %s from namespace %s: %w", addr, ns, err)
	}
	return c, true, nil
}

func setns(f *os.File) error { return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET) }

// proofOf is HMAC-SHA256(token, label ‖ parts...), as PROTOCOL.md 8.2 says.
func proofOf(token, label string, parts ...[]byte) (p [wire.ProofSize]byte) {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(label))
	for _, x := range parts {
		m.Write(x)
	}
	copy(p[:], m.Sum(nil))
	return p
}

// frame encodes m as a whole frame.
func frame(m wire.Msg) []byte { return wire.AppendFrame(nil, m, false, 0) }

// header encodes a frame header claiming length body bytes.
func header(typ wire.Type, length uint32) []byte {
	return wire.AppendHeader(nil, wire.Header{Version: wire.VersionMax, Type: typ, Length: length})
}

// rawPeer is a hand-driven peer in a namespace of its own: it speaks the
// peer protocol frame by frame, and can say what a sidecar never would.
type rawPeer struct {
	t     *testing.T
	ns    string
	addr  string // the sidecar it talks to
	token string
	// slot and window go in its Hello; 0: 256 KiB and 8.
	slot, window uint32
}

// dial opens a connection to the sidecar, closed when the test ends.
func (r *rawPeer) dial() net.Conn {
	r.t.Helper()
	c, err := dialFrom(r.ns, r.addr)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = c.Close() })
	return c
}

// send writes byte strings to c back to back.
func (r *rawPeer) send(c net.Conn, bs ...[]byte) {
	r.t.Helper()
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	for _, b := range bs {
		if _, err := c.Write(b); err != nil {
			r.t.Fatalf("write to %s: %v", r.addr, err)
		}
	}
}

// next reads c's next frame that is not a Heartbeat or a Credit, waiting
// up to d.
func next(c net.Conn, d time.Duration) (wire.Msg, error) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	var buf []byte
	for {
		var m wire.Msg
		var err error
		_, m, buf, err = wire.ReadFrame(c, buf)
		if err != nil {
			return nil, err
		}
		switch m.(type) {
		case *wire.Heartbeat, *wire.Credit:
			continue
		}
		return m, nil
	}
}

// expect reads the next frame and requires it to be a T.
func expect[T wire.Msg](t *testing.T, c net.Conn, what string) T {
	t.Helper()
	m, err := next(c, 10*time.Second)
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
	v, ok := m.(T)
	if !ok {
		t.Fatalf("waiting for %s, got %s %+v", what, m.Type(), m)
	}
	return v
}

// refused requires the sidecar to answer Error with code (when code is
// not CodeOK: some refusals are a bare close), then to close c, both
// within d. Frames before the Error (heartbeats, answers to earlier
// frames) are skipped.
func refused(t *testing.T, c net.Conn, code wire.Code, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	var got []string
	sawError := false
	for {
		m, err := next(c, time.Until(deadline))
		if err != nil {
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				t.Fatalf("still open %v after the hostile frame (frames read: %v)", d, got)
			case code != wire.CodeOK && !sawError:
				t.Fatalf("closed (%v) without an Error %s first (frames read: %v)", err, code, got)
			}
			return // closed: EOF, a reset, or the rest of a frame cut off
		}
		got = append(got, fmt.Sprintf("%s%+v", m.Type(), m))
		if e, ok := m.(*wire.Error); ok {
			if code != wire.CodeOK && e.Code != code {
				t.Fatalf("refused with %s (%q), want %s", e.Code, e.Message, code)
			}
			sawError = true
		}
	}
}

// rawSession is an authenticated control connection, with what it took
// to make it (the bytes sent, to replay them).
type rawSession struct {
	c          net.Conn
	nc, ns     [wire.NonceSize]byte
	welcome    *wire.Welcome
	hello      []byte // the Hello frame sent
	auth       []byte // the Auth frame sent
	challenged *wire.Challenge
}

// hello sends a Hello with a fresh nonce on c and reads the Challenge.
func (r *rawPeer) hello(c net.Conn) *rawSession {
	r.t.Helper()
	s := &rawSession{c: c}
	if _, err := io.ReadFull(rand.Reader, s.nc[:]); err != nil {
		r.t.Fatal(err)
	}
	slot, window := r.slot, r.window
	if slot == 0 {
		slot = 256 << 10
	}
	if window == 0 {
		window = 8
	}
	s.hello = frame(&wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, NodeName: "hostile",
		HostID: "lab-hostile", Nonce: s.nc, SlotSize: slot, Window: window})
	r.send(c, s.hello)
	s.challenged = expect[*wire.Challenge](r.t, c, "Challenge")
	s.ns = s.challenged.Nonce
	return s
}

// handshake authenticates a new control connection with token.
func (r *rawPeer) handshake() *rawSession {
	r.t.Helper()
	s := r.hello(r.dial())
	if want := proofOf(r.token, "stage-server", s.nc[:], s.ns[:]); s.challenged.Proof != want {
		r.t.Fatal("the sidecar's server proof does not match the token")
	}
	s.auth = frame(&wire.Auth{Proof: proofOf(r.token, "stage-client", s.nc[:], s.ns[:])})
	r.send(s.c, s.auth)
	s.welcome = expect[*wire.Welcome](r.t, s.c, "Welcome")
	return s
}

// dataHello is the DataHello frame for stream idx of s, with a proof for
// proofIdx (idx, unless the proof is to be wrong).
func (r *rawPeer) dataHello(s *rawSession, idx, proofIdx uint16) []byte {
	var ib [2]byte
	binary.LittleEndian.PutUint16(ib[:], proofIdx)
	return frame(&wire.DataHello{SessionID: s.welcome.SessionID, Stream: idx,
		Proof: proofOf(r.token, "stage-data", s.welcome.SessionID[:], ib[:], s.nc[:], s.ns[:])})
}

// attach opens data stream idx of s.
func (r *rawPeer) attach(s *rawSession, idx uint16) net.Conn {
	r.t.Helper()
	c := r.dial()
	r.send(c, r.dataHello(s, idx, idx))
	if a := expect[*wire.DataAccept](r.t, c, "DataAccept"); a.Stream != idx {
		r.t.Fatalf("DataAccept for stream %d, want %d", a.Stream, idx)
	}
	return c
}

// chunk encodes a chunk frame with payload.
func chunk(c *wire.Chunk, payload []byte) []byte {
	c.PayloadLen = uint32(len(payload))
	return append(wire.AppendChunkHead(nil, c, payload, false, 0), payload...)
}

// logMark is where a sidecar's log ends now.
func (sc *sidecar) logMark() int64 {
	sc.t.Helper()
	fi, err := os.Stat(sc.log)
	if err != nil {
		sc.t.Fatalf("stat %s: %v", sc.log, err)
	}
	return fi.Size()
}

// logSince returns what the sidecar logged after mark.
func (sc *sidecar) logSince(mark int64) string {
	sc.t.Helper()
	b, err := os.ReadFile(sc.log)
	if err != nil {
		sc.t.Fatalf("read %s: %v", sc.log, err)
	}
	return string(b[min(int(mark), len(b)):])
}

// waitLogged fails t unless the sidecar logs, after mark and within 5s,
// a line holding every one of parts.
func (sc *sidecar) waitLogged(t *testing.T, mark int64, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, line := range strings.Split(sc.logSince(mark), "\n") {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(line, p)
			}
			if all {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Errorf("%s logged no line with %q; it logged:\n%s", sc.name, parts, sc.logSince(mark))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
