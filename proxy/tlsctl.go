package proxy

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/panjf2000/gnet/v2"
	"go.uber.org/zap"

	"github.com/stage-kv/stage/wire"
)

// tlsControl carries an established control session over TLS, where gnet
// (which drives raw sockets) cannot: a reader goroutine decodes frames and
// hands them to the same handler as the event loops (session.handle), and
// a writer goroutine sends what session.send queues. Neither side ever
// blocks a caller of send: frames wait in a bounded buffer.
type tlsControl struct {
	ss *session
	c  *tls.Conn

	mu     sync.Mutex
	buf    []byte // frames to write, in order
	spare  []byte // the other buffer, swapped in while one is written
	closed bool
	over   bool          // the backlog overflowed: the session is closing
	kick   chan struct{} // capacity 1: buf has bytes
	done   chan struct{} // closed by close
}

// maxCtlBacklog bounds the control frames waiting for a peer that reads
// none: past it the session closes instead of growing.
const maxCtlBacklog = 16 << 20

// startTLSControl runs the session's control connection c; the goroutines
// belong to the server's wait group and end when the session closes.
func startTLSControl(ss *session, c *tls.Conn) *tlsControl {
	tc := &tlsControl{ss: ss, c: c, kick: make(chan struct{}, 1), done: make(chan struct{})}
	ss.s.wg.Add(2)
	go tc.readLoop()
	go tc.writeLoop()
	return tc
}

// write queues one encoded frame.
func (tc *tlsControl) write(frame []byte) {
	tc.mu.Lock()
	if tc.closed {
		tc.mu.Unlock()
		return
	}
	if tc.over {
		tc.mu.Unlock()
		return
	}
	if len(tc.buf)+len(frame) > maxCtlBacklog {
		tc.over = true
		tc.mu.Unlock()
		tc.ss.closeLater(fmt.Errorf("peer reads none of its control frames (%d B waiting)", maxCtlBacklog))
		return
	}
	tc.buf = append(tc.buf, frame...)
	tc.mu.Unlock()
	select {
	case tc.kick <- struct{}{}:
	default:
	}
}

// close ends both goroutines (idempotent).
func (tc *tlsControl) close() {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.closed {
		return
	}
	tc.closed = true
	close(tc.done)
	// Wake a blocked read or write; no close_notify (a write may be
	// blocked on a peer that reads nothing).
	_ = tc.c.NetConn().SetDeadline(time.Unix(1, 0))
	_ = tc.c.NetConn().Close()
}

func (tc *tlsControl) writeLoop() {
	defer tc.ss.s.wg.Done()
	for {
		select {
		case <-tc.done:
			return
		case <-tc.kick:
		}
		tc.mu.Lock()
		b := tc.buf
		tc.buf, tc.spare = tc.spare[:0], nil
		tc.mu.Unlock()
		if len(b) == 0 {
			continue
		}
		_, err := tc.c.Write(b)
		tc.mu.Lock()
		if tc.spare == nil {
			tc.spare = b[:0]
		}
		tc.mu.Unlock()
		if err != nil {
			tc.ss.closeLater(fmt.Errorf("write control frames: %w", err))
			return
		}
	}
}

func (tc *tlsControl) readLoop() {
	defer tc.ss.s.wg.Done()
	ss := tc.ss
	var buf []byte
	for {
		h, m, b, err := wire.ReadFrame(tc.c, buf)
		buf = b
		if err == nil && h.Flags&wire.FlagInline != 0 {
			err = errChunkOnControl
		}
		if err != nil {
			switch {
			case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), ss.ctx.Err() != nil:
				err = errPeerClosed
			case errors.Is(err, wire.ErrUnknownType), errors.Is(err, wire.ErrMalformed), errors.Is(err, wire.ErrTooLarge),
				errors.Is(err, wire.ErrBadMagic), errors.Is(err, wire.ErrBadVersion), errors.Is(err, wire.ErrChecksum), errors.Is(err, errChunkOnControl):
				ss.s.log.Warn("bad control frame; closing session", zap.String("peer", ss.peerName), zap.Error(err))
				_, _ = tc.c.Write(wire.AppendFrame(nil, &wire.Error{Code: wire.CodeMalformed, Message: err.Error()}, false, 0))
			}
			ss.close(err)
			return
		}
		ss.lastRecv.Store(time.Now().UnixNano())
		if ss.handle(m) != gnet.None {
			ss.close(errPeerClosed)
			return
		}
	}
}
