package proxy

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Stall detection: a data stream whose peer stopped reading (a pod under
// SIGSTOP, a full receive queue, a hostile peer) blocks its writer in
// writev, and with it the send slots of the chunks queued behind; one
// whose peer stopped sending in the middle of a chunk holds a receive
// slot. Neither moves a byte. Every tick the loop reads the kernel's byte
// counts (TCP_INFO: bytes of ours acknowledged, bytes received) of each
// stream that is inside a write or a chunk payload read; a stream whose
// count in that direction did not move for staging.stall_timeout is shut
// down, which makes it lost: its chunks go again on the session's other
// streams (the core's EvStreamLost), and a session whose streams all
// stalled closes, failing its transfers and giving their slots back,
// long before the transfers' progress deadline. Nothing is added to the
// data path but two atomic stores per chunk read.

// stallWatch is what the watchdog remembers of one stream (loop goroutine).
type stallWatch struct {
	acked, recvd           uint64
	ackedSince, recvdSince time.Time    // zero: that direction is not busy
	declared               atomic.Int64 // the stall_timeout it was dropped for; 0: never
}

// watchStreams drops the session's streams that stalled.
func (ss *session) watchStreams(now time.Time) {
	limit := ss.s.cfg.Staging.StallTimeout
	if limit <= 0 {
		return
	}
	streams := ss.streams.snapshot(ss.watched[:0])
	ss.watched = streams[:0]
	for _, ds := range streams {
		if ds == nil || ds.dead.Load() || ds.readerDone.Load() {
			continue
		}
		if dir := ds.stall.check(ds, now, limit); dir != "" {
			ss.s.metrics.stalls.Add(1)
			ss.s.log.Warn("data stream stalled: no bytes moved with a chunk to move; dropping it",
				zap.String("peer", ss.peerName), zap.Int("stream", ds.idx), zap.String("direction", dir),
				zap.Duration("stall_timeout", limit))
			ds.stall.declared.Store(int64(limit))
			ds.rc.Shutdown()
		}
	}
}

// check reports the direction ("write" or "read") in which ds has been
// busy without moving a byte for limit, or "".
func (w *stallWatch) check(ds *dataStream, now time.Time, limit time.Duration) string {
	writing, reading := ds.writing.Load() != 0, ds.reading.Load() != 0
	if !writing {
		w.ackedSince = time.Time{}
	}
	if !reading {
		w.recvdSince = time.Time{}
	}
	if !writing && !reading {
		return ""
	}
	acked, recvd, err := ds.rc.Moved()
	if err != nil {
		return "" // closing: its reader and writer are ending anyway
	}
	if writing && moved(&w.acked, &w.ackedSince, acked, now) >= limit {
		return "write"
	}
	if reading && moved(&w.recvd, &w.recvdSince, recvd, now) >= limit {
		return "read"
	}
	return ""
}

// moved records count n at now and returns how long it has not changed.
func moved(last *uint64, since *time.Time, n uint64, now time.Time) time.Duration {
	if since.IsZero() || n != *last {
		*last, *since = n, now
		return 0
	}
	return now.Sub(*since)
}
