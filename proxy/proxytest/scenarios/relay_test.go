package scenarios_test

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stage-kv/stage/wire"
)

// relay sits between a sender and its peer: every connection the sender
// opens goes through it. It can cut one data stream (both of its TCP
// connections close, as when a middlebox resets it) and damage chunk
// payloads on their way to the peer.
type relay struct {
	ln     net.Listener
	target string
	// damage, when set, is asked for each chunk frame going to the peer
	// (n counts them from 1, inline ones included); true flips a byte of
	// its payload.
	damage  atomic.Pointer[func(n int64) bool]
	chunks  atomic.Int64
	damaged atomic.Int64
	mu      sync.Mutex
	conns   []net.Conn
	streams map[uint16][2]net.Conn // the latest connection of each data stream
	wg      sync.WaitGroup
}

func newRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target, streams: map[uint16][2]net.Conn{}}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.close)
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) close() {
	_ = r.ln.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// cut closes data stream idx's connections; false if it has none.
func (r *relay) cut(idx uint16) bool {
	r.mu.Lock()
	p, ok := r.streams[idx]
	delete(r.streams, idx)
	r.mu.Unlock()
	if ok {
		_ = p[0].Close()
		_ = p[1].Close()
	}
	return ok
}

func (r *relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, c, up)
		r.mu.Unlock()
		r.wg.Add(2)
		go func() {
			defer r.wg.Done()
			_, _ = copyPlain(c, up)
			_ = c.Close()
			_ = up.Close()
		}()
		go func() {
			defer r.wg.Done()
			_ = r.forward(c, up)
			_ = c.Close()
			_ = up.Close()
		}()
	}
}

// copyPlain copies src to dst through a buffer. io.Copy between TCP
// connections splices through pipes that Go keeps in a pool past the
// connections' close: in the sidecars' process they would read as fds
// the test left open (proxytest.NoLeaks).
func copyPlain(dst io.Writer, src io.Reader) (int64, error) {
	return io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, 64<<10))
}

// frame reads one whole frame.
func frame(c net.Conn) (wire.Header, []byte, error) {
	b := make([]byte, wire.HeaderSize)
	if _, err := io.ReadFull(c, b); err != nil {
		return wire.Header{}, nil, err
	}
	h, err := wire.ParseHeader(b)
	if err != nil {
		return h, nil, err
	}
	b = append(b, make([]byte, h.Length)...)
	_, err = io.ReadFull(c, b[wire.HeaderSize:])
	return h, b, err
}

// forward copies the sender's side to the peer: frame by frame on data
// streams (damaging chunks when asked), as bytes on control sessions.
func (r *relay) forward(c, up net.Conn) error {
	h, b, err := frame(c)
	if err != nil {
		return err
	}
	if _, err := up.Write(b); err != nil {
		return err
	}
	if h.Type != wire.TypeDataHello {
		_, err := copyPlain(up, c)
		return err
	}
	m, err := wire.Decode(h.Type, b[wire.HeaderSize:])
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.streams[m.(*wire.DataHello).Stream] = [2]net.Conn{c, up}
	r.mu.Unlock()
	for {
		h, b, err := frame(c)
		if err != nil {
			return err
		}
		if h.Type == wire.TypeChunk {
			n := r.chunks.Add(1)
			if f := r.damage.Load(); f != nil && (*f)(n) {
				b[len(b)-1] ^= 0x5A // the payload's last byte
				r.damaged.Add(1)
			}
		}
		if _, err := up.Write(b); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
	}
}
