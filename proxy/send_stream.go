// A data stream's writer: the send side of the stream (the reader is
// recv_stream.go). It takes the chunks the sender loop enqueued and writes
// each, header and payload, in one writev or by splice (send_splice.go).

package proxy

import (
	"errors"
	"fmt"
	"time"

	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// writeLoop writes each chunk as one writev: frame header and meta from a
// reused buffer, then the payload straight from the pinned slot (or, in
// splice mode, the header and then the slot's pages by reference).
func (ds *dataStream) writeLoop() {
	defer ds.ss.s.wg.Done()
	defer ds.wg.Done()
	defer ds.rc.Done()
	w := &chunkWriter{ds: ds, head: make([]byte, 0, wire.HeaderSize+wire.ChunkFixedSize+64*wire.ChunkSegSize)}
	for {
		select {
		case job, ok := <-ds.sendq:
			if !ok {
				return
			}
			w.write(job)
		case <-ds.ctl.kick:
			if w.broken == nil {
				ds.wmu.Lock()
				if err := ds.flushCtl(); err != nil {
					w.fail(err)
				}
				ds.wmu.Unlock()
			}
		}
	}
}

// chunkWriter is the writer goroutine's state.
type chunkWriter struct {
	ds     *dataStream
	head   []byte
	ch     wire.Chunk
	iov    [2][]byte
	broken error
}

func (w *chunkWriter) fail(err error) {
	ds := w.ds
	w.broken = fmt.Errorf("write to %s stream %d: %w", ds.ss.peerName, ds.idx, err)
	ds.rc.Shutdown()
}

// write sends one chunk (after any queued small frames) and reports it.
func (w *chunkWriter) write(job sendJob) {
	ds := w.ds
	s := ds.ss.s
	c := job.cmd
	defer ds.queued.Add(-1)
	written := func(spliced bool, err error) {
		s.sender.post(staging.Event{Kind: staging.EvWritten, Transfer: c.Transfer, Chunk: c.Chunk, Slot: c.Slot, Stream: c.Stream,
			Spliced: spliced, Err: err, Now: time.Now()})
	}
	if w.broken != nil {
		written(false, w.broken)
		return
	}
	payload := s.sender.gather.slot(c.Slot).Host()[:c.C.Len]
	ch := &w.ch
	ch.Transfer, ch.Index, ch.Count, ch.PayloadLen = job.wireID, c.Chunk, c.Count, c.C.Len
	ch.Segs = ch.Segs[:0]
	for _, d := range c.C.Dst {
		ch.Segs = append(ch.Segs, wire.ChunkSeg{Region: d.Region, Len: d.Len, Offset: d.Off})
	}
	w.head = wire.AppendChunkHead(w.head[:0], ch, payload, job.checksum, 0)
	t0 := time.Now()
	ds.wmu.Lock()
	ds.writing.Store(t0.UnixNano())
	err := ds.flushCtl()
	spliced := false
	if err == nil {
		spliced, err = w.writeChunk(w.head, payload)
	}
	ds.writing.Store(0)
	ds.wmu.Unlock()
	s.metrics.netNanos[netSend].Add(int64(time.Since(t0)))
	if err != nil {
		w.fail(err)
		written(spliced, w.broken)
		return
	}
	ds.ss.link.BytesOut.Add(uint64(c.C.Len))
	ds.ss.link.ChunksOut.Add(1)
	written(spliced, nil)
}

var errStreamClosed = errors.New("stream closed")
