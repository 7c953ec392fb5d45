package proxy

import (
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/rawconn"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/tlsconn"
	"github.com/stage-kv/stage/wire"
)

// streamConn is what a data stream's reader and writer need of their
// connection: a rawconn.Conn (plaintext: blocking system calls straight
// from and into pinned slots) or, with security.tls, a tlsconn.Conn.
type streamConn interface {
	Writev(bufs [][]byte) error
	TryWrite(b []byte) (int, error) // what fits now, never blocking; 0 is fine
	Read(p []byte) (int, error)
	ReadFull(p []byte) error
	Discard(n int64, scratch []byte) error
	Shutdown() // wakes reader and writer
	Done()     // once per user; the last closes
	SetSpin(p spin.Policy)
	Moved() (acked, received uint64, err error) // the kernel's byte counts (stall.go)
	Queued() (uint64, error)                    // bytes written and not yet acknowledged (balance.go)
}

// closeUnused closes a stream connection that never got its reader and
// writer: it answers for both of them.
func closeUnused(rc streamConn) {
	rc.Shutdown()
	rc.Done()
	rc.Done()
}

// newStreamConn takes over an established data stream connection.
func newStreamConn(c net.Conn) (streamConn, error) {
	if tc, ok := c.(*tls.Conn); ok {
		sc, err := tlsconn.New(tc, 2)
		if err != nil {
			return nil, err
		}
		return sc, nil
	}
	rc, err := rawconn.New(c, 2)
	if err != nil {
		return nil, err
	}
	return rc, nil
}

// setSocketBuffers asks the kernel for send and receive buffers of b bytes
// on a data stream (staging.socket_buffer), which turns off its autotuning:
// bytes queued in a socket are bytes the sender no longer balances across
// streams. The kernel caps b at net.core.wmem_max/rmem_max (and doubles
// it). A refusal leaves the kernel's sizes, and the caller says so.
func setSocketBuffers(c net.Conn, b int) error {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return fmt.Errorf("%T is not a TCP connection", c)
	}
	if err := tc.SetWriteBuffer(b); err != nil {
		return fmt.Errorf("SO_SNDBUF %d: %w", b, err)
	}
	if err := tc.SetReadBuffer(b); err != nil {
		return fmt.Errorf("SO_RCVBUF %d: %w", b, err)
	}
	return nil
}

// dataStream is one TCP connection of a session carrying chunks both ways:
// a writer goroutine sends what the Sender core schedules on it, a reader
// goroutine lands what the peer sends.
type dataStream struct {
	ss    *session
	idx   int
	rc    streamConn
	sendq chan sendJob
	wg    sync.WaitGroup

	// wmu keeps whole frames together: the writer holds it for each
	// chunk, an inline push (writeNow) for its frames.
	wmu    sync.Mutex
	queued atomic.Int32 // jobs enqueued and not yet written
	dead   atomic.Bool  // stopped or lost: pick another stream
	ctl    ctlQueue     // small frames (inline acks) to write ahead of chunks

	mu      sync.Mutex
	stopped bool
	// readerDone: the reader exited; the stream carries nothing more.
	readerDone atomic.Bool
	// writing: unix nanos when the writev in progress began; 0 when none.
	writing atomic.Int64
	// reading: unix nanos when the reader began reading a chunk's payload
	// into a receive slot; 0 when none.
	reading atomic.Int64
	stall   stallWatch // the loop goroutine's only (stall.go)
}

type sendJob struct {
	cmd      staging.SendCmd
	wireID   uint64
	checksum bool
}

// attach takes over c as stream i, writes greet on it first when not nil
// (the accepting side's DataAccept, before any chunk can follow it), and
// starts the stream's goroutines; false if i is taken by a live stream or
// c unusable. With greet, the core hears that the stream is up
// (EvStreamUp) before greet is written: the peer may ask for a pull the
// moment it reads greet, and a pull the core took before it knew of any
// stream failed. Chunks the core queues meanwhile wait for the writer,
// which starts after greet. Without greet the caller tells the core.
// A dead stream i (its reader ended: the stream was lost) is
// replaced: it is stopped and its goroutines waited for first, so every
// chunk it held is reported to the core before the new stream exists.
func (ss *session) attach(i int, c net.Conn, greet wire.Msg) bool {
	old, ok := ss.streams.claim(i)
	if !ok {
		_ = c.Close()
		return false
	}
	if old != nil {
		old.stop()
		old.wg.Wait()
	}
	if b := int(ss.s.cfg.Staging.SocketBuffer); b > 0 {
		if err := setSocketBuffers(c, b); err != nil {
			ss.s.log.Warn("staging.socket_buffer not applied; the kernel sizes this data stream's buffers",
				zap.String("peer", ss.peerName), zap.Int("stream", i), zap.Error(err))
		}
	}
	rc, err := newStreamConn(c)
	if err == nil {
		rc.SetSpin(ss.s.cfg.Staging.ReadSpin.Resolve())
		if err = ss.s.sender.prepareSplice(rc); err != nil {
			closeUnused(rc)
		}
	}
	if err != nil {
		ss.s.log.Warn("data stream refused", zap.String("peer", ss.peerName), zap.Int("stream", i), zap.Error(err))
		_ = c.Close() // already closed when rawconn took it over: harmless
		return false
	}
	ds := &dataStream{ss: ss, idx: i, rc: rc, sendq: make(chan sendJob, ss.s.sender.pool.Cap()+1), ctl: newCtlQueue()}
	if !ss.streams.put(i, old, ds, !ss.dialer) {
		closeUnused(rc)
		return false
	}
	if greet != nil {
		ss.s.sender.post(staging.Event{Kind: staging.EvStreamUp, Session: ss.id, Stream: i, Now: time.Now()})
		if err := rc.Writev([][]byte{wire.AppendFrame(nil, greet, false, 0)}); err != nil {
			ss.s.log.Warn("data stream lost while answering", zap.String("peer", ss.peerName), zap.Int("stream", i), zap.Error(err))
		}
	}
	ss.s.wg.Add(2)
	ds.wg.Add(2)
	go ds.writeLoop()
	go ds.readLoop()
	return true
}

// stop closes the connection and the send queue; the goroutines exit.
func (ds *dataStream) stop() {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	ds.dead.Store(true)
	if !ds.stopped {
		ds.stopped = true
		ds.rc.Shutdown()
		close(ds.sendq)
	}
}

// enqueue hands a job to the writer; false once the stream is stopped. The
// queue holds as many jobs as there are send slots, so this never blocks.
func (ds *dataStream) enqueue(j sendJob) bool {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.stopped {
		return false
	}
	ds.queued.Add(1)
	ds.sendq <- j
	return true
}

// writeNow writes bufs as one writev between the writer's chunks, from the
// calling goroutine (the latency path).
func (ds *dataStream) writeNow(bufs [][]byte) error {
	if ds.dead.Load() {
		return errStreamClosed
	}
	ds.wmu.Lock()
	defer ds.wmu.Unlock()
	ds.writing.Store(time.Now().UnixNano())
	defer ds.writing.Store(0)
	if err := ds.flushCtl(); err != nil {
		return err
	}
	return ds.rc.Writev(bufs)
}

// lost reports a stream gone while its session lives. When it was the
// session's last one, the session closes too: nothing could move on it
// again, while its heartbeats would keep it up (and the route from
// redialing) forever.
func (ds *dataStream) lost(err error) {
	ds.dead.Store(true)
	ds.ss.s.inline.fail(ds.ss, codeErr(wire.CodePeerUnavailable, "data stream %d to %s lost before the small push was answered: %w", ds.idx, ds.ss.peerName, err),
		func(ix *inlineXfer) bool { return ix.stream != ds.idx })
	ds.ss.s.sender.post(staging.Event{Kind: staging.EvStreamLost, Session: ds.ss.id, Stream: ds.idx, Err: err, Now: time.Now()})
	ds.ss.s.log.Warn("data stream lost", zap.String("peer", ds.ss.peerName), zap.Int("stream", ds.idx), zap.Error(err))
	if !ds.ss.streams.left() {
		ds.ss.close(fmt.Errorf("every data stream was lost (last: %w)", err))
		return
	}
	ds.ss.startRedial(ds.idx)
}
