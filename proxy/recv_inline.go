package proxy

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// The receiving side of the latency path (send_inline.go sends): an inline
// Announce admitted on the data stream that carries it, then its one
// chunk landed synchronously and acked on that same stream. The receive
// core counts it like any chunk, but it takes no credit and returns none.

// readInlineAnnounce admits the transfer an inline Announce on a data
// stream names, or refuses it (its chunk, which follows, is then drained).
// Only a stream-level failure is returned.
func (ds *dataStream) readInlineAnnounce(h wire.Header, body *[]byte) error {
	if h.Length > maxInlineAnnounce {
		return fmt.Errorf("inline announce of %d B exceeds %d", h.Length, maxInlineAnnounce)
	}
	if cap(*body) < int(h.Length) {
		*body = make([]byte, h.Length)
	}
	b := (*body)[:h.Length]
	if err := ds.rc.ReadFull(b); err != nil {
		return fmt.Errorf("read inline announce: %w", err)
	}
	if err := wire.VerifyCRC(h, b); err != nil {
		return err
	}
	m, err := wire.Decode(wire.TypeAnnounce, b)
	if err != nil {
		return err
	}
	a := m.(*wire.Announce)
	s := ds.ss.s
	if err := s.admitPush(ds.ss, a, ds); err != nil {
		s.refusePush(ds.ss, a.Transfer, err)
	}
	return nil
}

// landInline reads an inline chunk's payload into a small slot, checks it,
// scatters it synchronously and tells the core it landed (which acks it
// on this stream). x is held by the chunk (admit). Only a stream-level
// failure is returned.
func (ds *dataStream) landInline(h wire.Header, ch *wire.Chunk, meta []byte, l *landing, x *inXfer) error {
	s, ss := ds.ss.s, ds.ss
	defer x.release()
	pool := s.inline.pool
	slot, ok := -1, false
	if pool != nil && int(ch.PayloadLen) <= pool.SlotSize() {
		slot, ok = pool.TryAcquire()
	}
	if !ok {
		// No small slot here (or the path is off on our side): a receive
		// slot does, as for any chunk.
		pool = s.recvPool
		var err error
		if slot, err = pool.Acquire(ss.ctx); err != nil {
			return err
		}
	}
	defer pool.Release(slot)
	buf := pool.Slot(slot).Slice(0, int(ch.PayloadLen))
	if err := ds.rc.ReadFull(buf.Host()); err != nil {
		return fmt.Errorf("read inline payload: %w", err)
	}
	if h.Flags&wire.FlagCRC != 0 {
		if got := wire.ChunkCRC(meta, buf.Host()); got != h.CRC {
			ss.link.ChecksumErrors.Add(1)
			err := codeErr(wire.CodeChecksum, "inline transfer %d from %s: CRC32C %08x, header says %08x", ch.Transfer, ss.peerName, got, h.CRC)
			ss.in.recv(staging.RecvEvent{Kind: staging.RxDamaged, Transfer: x.wireID, Chunk: ch.Index, Inline: true, Err: err}, x)
			return nil
		}
	}
	ss.link.BytesIn.Add(uint64(ch.PayloadLen))
	ss.link.ChunksIn.Add(1)
	l.sync = x.dest.segs(ch, l, l.sync[:0])
	err := s.inline.lane.Scatter(l.sync, buf)
	if err != nil {
		s.log.Warn("inline scatter failed", zap.String("peer", ss.peerName), zap.Uint64("transfer", ch.Transfer), zap.Error(err))
	}
	x.landed(ch.Index, uint64(ch.PayloadLen), err)
	return nil
}
