package proxy

import (
	"fmt"
	"time"

	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// The latency path. A push of at most staging.inline_max bytes skips the
// pipeline: the submitting goroutine gathers it into a small pinned slot
// synchronously (staging.Lane) and writes an Announce and the whole
// payload, both flagged wire.FlagInline, on one data stream in one writev.
// That stream's reader on the receiver admits the transfer, lands the
// payload synchronously and acks on the control session, as for any chunk.
// No credit is taken or returned, no Accept is sent, and the Sender core
// never sees the transfer. Everything a peer names is checked exactly as
// on the pipeline (admitPush, inXfer.resolve).

// inlineSlots is how many small pinned slots the latency path has; a push
// that finds none free takes the pipeline instead.
const inlineSlots = 16

// maxInlineAnnounce bounds the Announce a data stream accepts before an
// inline chunk: the body is read into memory before it is decoded.
const maxInlineAnnounce = 256 << 10

// inlinePath is the latency path's own: its small pinned slots (nil:
// our pushes never take the path) and the lane of synchronous copies,
// which also lands peers' inline pushes (recv_inline.go). It sends our
// small pushes and takes the peer's answers to them; what they finish is
// the server's engine-facing transfers.
type inlinePath struct {
	s    *Server
	pool *staging.Pool
	lane *staging.Lane
}

// inlineXfer is a small push sent on the latency path, waiting for the
// peer's Ack or Nack.
type inlineXfer struct {
	lx       *localXfer
	stream   int
	deadline time.Time // zero: none
}

// send sends a small push on the latency path and reports true, or
// does nothing and reports false when the push does not qualify (too
// large, no free inline slot, no live data stream, more than one chunk)
// and must take the pipeline, or the route names a same-node transport
// (ipc, shm). regions are the push's source regions; it
// lets go of them once their bytes are gathered.
func (ip *inlinePath) send(ss *session, lx *localXfer, regions []*region.Region, m *wire.Submit, chk *region.Checked, checksum bool) bool {
	if ip.pool == nil || lx.total > uint64(ip.pool.SlotSize()) {
		return false
	}
	if ss.route != nil {
		if t := ss.route.Conf().Transport; t == "ipc" || t == "shm" {
			return false // the route asked for a same-node path by name
		}
	}
	plan, err := staging.NewPlan(chk.Plan, ip.pool.SlotSize())
	if err != nil || plan.Len() != 1 {
		return false
	}
	ds := ss.streams.quiet()
	if ds == nil {
		return false
	}
	slot, ok := ip.pool.TryAcquire()
	if !ok {
		return false
	}
	defer ip.pool.Release(slot)
	c := plan.Chunk(0)
	buf := ip.pool.Slot(slot).Slice(0, int(c.Len))
	err = ip.lane.Gather(buf, c.Src)
	region.ReleaseAll(regions)
	if err != nil {
		ip.s.finishLocal(lx, codeErr(wire.CodeDevice, "gather %d B from %s for transfer %d: %w", c.Len, ip.s.dev, lx.id, err))
		return true
	}
	lx.inline.Store(true)
	ix := &inlineXfer{lx: lx, stream: ds.idx}
	if lx.timeout > 0 {
		ix.deadline = time.Now().Add(lx.timeout)
	}
	if !ss.out.expectInline(lx.wireID, ix) { // the session closed
		ip.s.finishLocal(lx, codeErr(wire.CodePeerUnavailable, "session with %s closed", ss.peerName))
		return true
	}
	lx.setState(wire.StateRunning)
	head := wire.AppendFrame(make([]byte, 0, 512), &wire.Announce{Transfer: lx.wireID, Tag: m.Tag, Total: lx.total, Regions: m.RemoteNames, Ends: chk.Ends}, false, wire.FlagInline)
	ch := wire.Chunk{Transfer: lx.wireID, Index: 0, Count: 1, PayloadLen: c.Len}
	for _, d := range c.Dst {
		ch.Segs = append(ch.Segs, wire.ChunkSeg{Region: d.Region, Len: d.Len, Offset: d.Off})
	}
	head = wire.AppendChunkHead(head, &ch, buf.Host(), checksum, wire.FlagInline)
	if err := ds.writeNow([][]byte{head, buf.Host()}); err != nil {
		if ix := ss.out.takeInline(lx.wireID); ix != nil {
			ip.s.finishLocal(lx, codeErr(wire.CodePeerUnavailable, "send %d B to %s on stream %d: %w", c.Len, ss.peerName, ds.idx, err))
		}
		return true
	}
	ss.link.BytesOut.Add(uint64(c.Len))
	ss.link.ChunksOut.Add(1)
	return true
}

// answered handles the peer's Ack (err nil) or Nack of one of our
// inline pushes; a late answer to one already ended is dropped.
func (ip *inlinePath) answered(ss *session, id uint64, err error) {
	ix := ss.out.takeInline(id)
	if ix == nil {
		return
	}
	if err == nil {
		ix.lx.addDone(ix.lx.total)
		ss.link.XfersInline.Add(1)
	}
	ip.s.finishLocal(ix.lx, err)
}

// fail fails the inline pushes of ss for which keep says false (all of
// them when keep is nil).
func (ip *inlinePath) fail(ss *session, err error, keep func(*inlineXfer) bool) {
	for _, ix := range ss.out.takeInlines(keep) {
		ip.s.finishLocal(ix.lx, err)
	}
}

// expire fails the inline pushes of ss past their progress deadline,
// and, as for the pipeline's, shuts down streams stuck writing to a peer
// that stopped reading (a small push's writer may be blocked there).
func (ip *inlinePath) expire(ss *session, now time.Time) {
	expired := 0
	ip.fail(ss, codeErr(wire.CodeTimeout, "no answer from %s to a small push before its progress deadline", ss.peerName),
		func(ix *inlineXfer) bool {
			keep := ix.deadline.IsZero() || now.Before(ix.deadline)
			if !keep {
				expired++
			}
			return keep
		})
	if expired > 0 {
		ss.streams.unstick(now)
	}
}

// readInlineAnswer handles an Ack or Nack frame on a data stream: the
// answer to one of our inline pushes. Only a stream-level failure is
// returned.
func (ds *dataStream) readInlineAnswer(h wire.Header, body *[]byte) error {
	if h.Length > maxInlineAnnounce {
		return fmt.Errorf("%s of %d B on a data stream exceeds %d", h.Type, h.Length, maxInlineAnnounce)
	}
	if cap(*body) < int(h.Length) {
		*body = make([]byte, h.Length)
	}
	b := (*body)[:h.Length]
	if err := ds.rc.ReadFull(b); err != nil {
		return fmt.Errorf("read %s: %w", h.Type, err)
	}
	if err := wire.VerifyCRC(h, b); err != nil {
		return err
	}
	m, err := wire.Decode(h.Type, b)
	if err != nil {
		return err
	}
	// Only our small pushes are answered here (send_answers.go): an Ack
	// of another kind fails the stream, a Nack of another kind is dropped.
	ss := ds.ss
	switch m := m.(type) {
	case *wire.Ack:
		switch a := answererOf(ss, m.Transfer).(type) {
		case *inlineXfer, inlineEnded:
			a.ack(ss, m, time.Now())
		default:
			return fmt.Errorf("data stream got an Ack for transfer %d, not one of our small pushes", m.Transfer)
		}
	case *wire.Nack:
		switch a := answererOf(ss, m.Transfer).(type) {
		case *inlineXfer, inlineEnded:
			a.nack(ss, m.Transfer, codeErr(m.Code, "peer %s: %s", ss.peerName, m.Message), time.Now())
		}
	}
	return nil
}
