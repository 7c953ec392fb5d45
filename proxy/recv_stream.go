package proxy

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// A data stream's reader: a chunk's walk from the socket to the device.
// It reads the frame header (readHeader), the chunk's fixed part and
// segments (readMeta), asks the session's receive core whether the chunk
// lands (admit: recv_xfer.go; the destination's checks: recv_dest.go),
// and then drains it (drain) or reads its payload into a receive slot,
// checks its CRC32C and scatters it to the device (land); the core
// answers when the scatter completed. An inline chunk lands on the
// latency path instead (recv_inline.go).

// readLoop runs the reader until its stream ends, and reports the loss.
func (ds *dataStream) readLoop() {
	defer ds.ss.s.wg.Done()
	defer ds.wg.Done()
	defer ds.rc.Done()
	err := ds.read()
	if d := ds.stall.declared.Load(); d != 0 && err != nil {
		err = fmt.Errorf("stalled: no bytes moved for %v with a chunk to move (staging.stall_timeout): %w", time.Duration(d), err)
	}
	ds.readerDone.Store(true)
	if ds.ss.ctx.Err() == nil {
		ds.lost(err)
	}
	ds.rc.Shutdown()
}

// chunkReader is a reader's state: buffers reused from chunk to chunk.
type chunkReader struct {
	ds       *dataStream
	hb       [wire.HeaderSize + wire.ChunkFixedSize]byte
	meta     []byte // the chunk's fixed part and segments, for its CRC32C
	ch       wire.Chunk
	land     landing // where the chunk goes (recv_dest.go)
	scratch  []byte  // for draining refused payloads, made on first use
	announce []byte  // inline Announce and answer bodies, made on first use
	out      recvOut // the receive core's answer to the chunk (admit)
}

// read takes frames until the stream fails; only a stream-level failure
// ends it.
func (ds *dataStream) read() error {
	r := &chunkReader{ds: ds, meta: make([]byte, 0, wire.ChunkFixedSize+256*wire.ChunkSegSize)}
	for {
		if err := r.next(); err != nil {
			return err
		}
	}
}

// next reads one frame and does what it says.
func (r *chunkReader) next() error {
	ds := r.ds
	h, err := r.readHeader()
	if err != nil {
		return err
	}
	switch {
	case h.Type == wire.TypeAnnounce && h.Flags&wire.FlagInline != 0:
		return ds.readInlineAnnounce(h, &r.announce)
	case h.Type == wire.TypeAck || h.Type == wire.TypeNack:
		return ds.readInlineAnswer(h, &r.announce)
	case h.Type != wire.TypeChunk:
		return fmt.Errorf("data stream got a %s frame", h.Type)
	}
	if err := r.readMeta(h); err != nil {
		return err
	}
	inline := h.Flags&wire.FlagInline != 0
	x := r.admit(inline)
	if !r.out.Hold {
		return r.drain(&r.out)
	}
	if inline {
		return ds.landInline(h, &r.ch, r.meta, &r.land, x)
	}
	return r.landChunk(h, x)
}

// readHeader reads a frame's header.
func (r *chunkReader) readHeader() (wire.Header, error) {
	if err := r.ds.rc.ReadFull(r.hb[:wire.HeaderSize]); err != nil {
		return wire.Header{}, fmt.Errorf("read chunk header: %w", err)
	}
	return wire.ParseHeader(r.hb[:wire.HeaderSize])
}

// readMeta reads a chunk's fixed part and segments into r.meta and r.ch.
func (r *chunkReader) readMeta(h wire.Header) error {
	rc := r.ds.rc
	if err := rc.ReadFull(r.hb[wire.HeaderSize:]); err != nil {
		return fmt.Errorf("read chunk meta: %w", err)
	}
	nsegs, err := wire.DecodeChunkFixed(h, r.hb[wire.HeaderSize:], &r.ch)
	if err != nil {
		return err
	}
	need := wire.ChunkFixedSize + nsegs*wire.ChunkSegSize
	if cap(r.meta) < need {
		r.meta = make([]byte, 0, need)
	}
	r.meta = append(r.meta[:0], r.hb[wire.HeaderSize:]...)
	r.meta = r.meta[:need]
	if err := rc.ReadFull(r.meta[wire.ChunkFixedSize:]); err != nil {
		return fmt.Errorf("read chunk segments: %w", err)
	}
	if err := wire.DecodeChunkSegs(r.meta[wire.ChunkFixedSize:], nsegs, &r.ch); err != nil {
		return err
	}
	if slot := r.ds.ss.s.recvPool.SlotSize(); int(r.ch.PayloadLen) > slot {
		return fmt.Errorf("chunk of %d B exceeds our slot size %d", r.ch.PayloadLen, slot)
	}
	return nil
}

// admit finds the chunk's transfer (waiting briefly for an Announce it
// overtook), checks it against the destination and asks the receive
// core, whose answer it leaves in r.out. The core's answers are the
// caller's to perform: a drained chunk's come after its payload is gone.
func (r *chunkReader) admit(inline bool) *inXfer {
	ss, ch, o := r.ds.ss, &r.ch, &r.out
	o.reset()
	for {
		x := ss.in.incoming(ch.Transfer)
		var serr error
		if x != nil {
			serr = x.dest.check(ch, &r.land)
		}
		ev := staging.RecvEvent{Kind: staging.RxChunk, Transfer: ch.Transfer, Chunk: ch.Index, Count: ch.Count, Inline: inline, Err: serr}
		if !ss.in.stepIfCurrent(ev, x, o) {
			// Opened or ended since incoming looked: look again (a
			// transfer only goes from unknown to open to gone).
			continue
		}
		if o.Hold {
			ss.in.perform(o)
		}
		return x
	}
}

// drain reads and drops the payload of a chunk that will not land, then
// performs the core's answers (its credit back; a Nack when it broke a
// rule). A stream that fails meanwhile returns no credit: the sender
// takes back the credits of a lost stream's chunks itself.
func (r *chunkReader) drain(o *recvOut) error {
	ss := r.ds.ss
	if r.scratch == nil {
		r.scratch = make([]byte, 256<<10)
	}
	err := r.ds.rc.Discard(int64(r.ch.PayloadLen), r.scratch)
	if err != nil {
		o.Credits = 0
	}
	if o.Err != nil {
		ss.s.log.Warn("refused chunk", zap.String("peer", ss.peerName), zap.Uint64("transfer", r.ch.Transfer), zap.Error(recvErr(o.Err)))
	}
	ss.in.perform(o)
	if err != nil {
		return fmt.Errorf("drain chunk payload: %w", err)
	}
	return nil
}

// landChunk reads a held chunk's payload into a receive slot, checks its
// CRC32C and enqueues its scatter; the slot goes back, and the core
// hears that the chunk landed, when the scatter completed.
func (r *chunkReader) landChunk(h wire.Header, x *inXfer) error {
	ds, ss := r.ds, r.ds.ss
	s := ss.s
	slot, err := s.recvPool.AcquireAs(ss.ctx, &ss.recvShare)
	if err != nil {
		x.release()
		return err
	}
	buf := s.recvPool.Slot(slot).Slice(0, int(r.ch.PayloadLen))
	t0 := time.Now()
	ds.reading.Store(t0.UnixNano())
	err = ds.rc.ReadFull(buf.Host())
	ds.reading.Store(0)
	s.metrics.netNanos[netRecv].Add(int64(time.Since(t0)))
	if err != nil {
		s.recvPool.ReleaseAs(slot, &ss.recvShare)
		x.release()
		return fmt.Errorf("read chunk payload: %w", err)
	}
	if h.Flags&wire.FlagCRC != 0 {
		if got := wire.ChunkCRC(r.meta, buf.Host()); got != h.CRC {
			s.recvPool.ReleaseAs(slot, &ss.recvShare)
			ss.in.damaged(x, &r.ch, got, h.CRC)
			x.release()
			return nil
		}
	}
	ss.link.BytesIn.Add(uint64(r.ch.PayloadLen))
	ss.link.ChunksIn.Add(1)
	idx, n := r.ch.Index, uint64(r.ch.PayloadLen)
	t1 := time.Now()
	landed := func(err error) {
		s.metrics.copyNanos[copyScatter].Add(int64(time.Since(t1)))
		s.recvPool.ReleaseAs(slot, &ss.recvShare)
		x.landed(idx, n, err)
		x.release()
	}
	if err := x.dest.scatter(s.copiers.take(), &r.ch, &r.land, buf, landed); err != nil {
		s.recvPool.ReleaseAs(slot, &ss.recvShare)
		x.fail(codeErr(wire.CodeDevice, "scatter chunk %d to %s: %w", idx, s.dev, err), true)
		x.release()
	}
	return nil
}
