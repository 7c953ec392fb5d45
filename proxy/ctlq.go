package proxy

import (
	"sync"

	"go.uber.org/zap"
)

// ctlQueue holds small frames a data stream's reader wants written (acks
// of inline pushes) without ever blocking the reader: a reader that waited
// on its socket's send side could deadlock with the peer's reader doing the
// same. The reader writes what fits at once (rawconn.TryWrite, only when
// no chunk is being written); the rest waits here and the writer goroutine
// sends it, ahead of its next chunk.
type ctlQueue struct {
	mu    sync.Mutex
	buf   []byte        // bytes to write, in order
	spare []byte        // the other buffer, swapped in while one is written
	kick  chan struct{} // capacity 1: buf has bytes for the writer
}

func newCtlQueue() ctlQueue { return ctlQueue{kick: make(chan struct{}, 1)} }

// maxCtlQueued bounds what waits in a ctlQueue: a peer that sends small
// pushes but reads none of our acks loses the stream instead of growing it.
const maxCtlQueued = 1 << 20

// sendCtl queues frame and writes as much of the queue as the socket takes
// now, without blocking; the writer goroutine is told of any rest.
func (ds *dataStream) sendCtl(frame []byte) {
	q := &ds.ctl
	q.mu.Lock()
	if len(q.buf)+len(frame) > maxCtlQueued {
		q.mu.Unlock()
		ds.ss.s.log.Warn("peer reads none of our acks; dropping the data stream", zap.String("peer", ds.ss.peerName), zap.Int("stream", ds.idx))
		ds.rc.Shutdown()
		return
	}
	q.buf = append(q.buf, frame...)
	q.mu.Unlock()
	if ds.wmu.TryLock() {
		ds.tryFlushCtl()
		ds.wmu.Unlock()
	}
	q.mu.Lock()
	left := len(q.buf) > 0
	q.mu.Unlock()
	if left {
		select {
		case q.kick <- struct{}{}:
		default:
		}
	}
}

// tryFlushCtl writes what the socket takes of the queue now (wmu held). An
// error is left for the writer, which meets it on its next write.
func (ds *dataStream) tryFlushCtl() {
	q := &ds.ctl
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.buf) == 0 {
		return
	}
	n, err := ds.rc.TryWrite(q.buf)
	if err != nil {
		return
	}
	q.buf = append(q.buf[:0], q.buf[n:]...)
}

// flushCtl writes the whole queue, blocking (wmu held; writer side only).
func (ds *dataStream) flushCtl() error {
	q := &ds.ctl
	for {
		q.mu.Lock()
		b := q.buf
		if len(b) == 0 {
			q.mu.Unlock()
			return nil
		}
		// Write outside q.mu, so a reader queueing more never waits on
		// the socket: it appends to the other buffer meanwhile.
		q.buf, q.spare = q.spare[:0], nil
		q.mu.Unlock()
		err := ds.rc.Writev([][]byte{b})
		q.mu.Lock()
		if q.spare == nil {
			q.spare = b[:0]
		}
		q.mu.Unlock()
		if err != nil {
			return err
		}
	}
}
