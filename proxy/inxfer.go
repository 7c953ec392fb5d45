package proxy

import (
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/wire"
)

// maxChunksPerTransfer bounds the landed bitmap a peer can make us allocate.
const maxChunksPerTransfer = 1 << 24

// inXfer is a transfer whose chunks land here: a peer's push, or our pull.
type inXfer struct {
	s       *Server
	ss      *session
	wireID  uint64
	tag     string
	dir     wire.Direction   // as the initiator sees it
	regions []*region.Region // destination regions (references held)
	total   uint64
	local   *localXfer // our pull; nil for a peer's push
	timeout time.Duration
	kv      *kvlayout.Side // a KV transfer: chunks name canonical offsets, mapped here (kv.go)
	kvn     *kvNote        // a peer's KV push: what Notify says landed

	mu       sync.Mutex
	count    uint32
	bits     []uint64
	nLanded  uint32
	bytes    uint64
	inflight int
	inline   bool        // a small push on the latency path: it holds no credit
	ackOn    *dataStream // inline: acks go on this data stream, not the control session
	finished bool
	released bool
	ring     bool // chunks come through the shared ring (proxy/node, shm.go)
	progress time.Time
}

func (ss *session) lookupIn(wireID uint64) *inXfer {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.in[wireID]
}

// resolve checks a chunk against the transfer and turns its segments into
// device ranges, appending to segs. On success the caller holds an inflight
// reference to drop with release.
func (x *inXfer) resolve(ch *wire.Chunk, segs []device.Seg) ([]device.Seg, error) {
	segs, err := x.check(ch, segs)
	if err == nil && x.kv != nil {
		// Mapped outside x.mu: the streams of one transfer map their
		// chunks at once (the side is read-only; the inflight reference
		// keeps its regions).
		segs = kvSegs(x.kv, x.regions, ch.Segs[0].Offset, ch.Segs[0].Len, segs)
	}
	return segs, err
}

// resolveRuns is resolve for a KV chunk (x.kv set): its canonical range
// mapped to strided runs, appended to runs, for Copier.ScatterRuns.
func (x *inXfer) resolveRuns(ch *wire.Chunk, runs []device.Run) ([]device.Run, error) {
	_, err := x.check(ch, nil)
	if err == nil {
		runs = kvRuns(x.kv, x.regions, ch.Segs[0].Offset, ch.Segs[0].Len, runs)
	}
	return runs, err
}

// check is resolve under x.mu: everything but a KV chunk's mapping.
func (x *inXfer) check(ch *wire.Chunk, segs []device.Seg) ([]device.Seg, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.finished {
		return segs, errFinished
	}
	if x.count == 0 {
		if ch.Count == 0 || ch.Count > maxChunksPerTransfer || uint64(ch.Count) > x.total {
			return segs, codeErr(wire.CodeMalformed, "chunk count %d is impossible for %d B", ch.Count, x.total)
		}
		x.count = ch.Count
		x.bits = make([]uint64, (ch.Count+63)/64)
	} else if ch.Count != x.count {
		return segs, codeErr(wire.CodeMalformed, "chunk %d says %d chunks, earlier chunks said %d", ch.Index, ch.Count, x.count)
	}
	if ch.Index >= x.count {
		return segs, codeErr(wire.CodeMalformed, "chunk index %d of %d", ch.Index, x.count)
	}
	if x.kv != nil {
		// A KV chunk's one segment is its place in the canonical stream;
		// our own layout says where its rows go (resolve and resolveRuns map
		// it with kvSegs and kvRuns).
		if len(ch.Segs) != 1 || ch.Segs[0].Region != wire.KVRegion || !region.InRange(ch.Segs[0].Offset, uint64(ch.Segs[0].Len), x.total) {
			return segs, codeErr(wire.CodeMalformed, "chunk %d of a KV transfer of %d B must name one canonical range inside it", ch.Index, x.total)
		}
		x.inflight++
		return segs, nil
	}
	for i, cs := range ch.Segs {
		if int(cs.Region) >= len(x.regions) {
			return segs, codeErr(wire.CodeUnknownRegion, "chunk %d segment %d names region #%d; the transfer has %d", ch.Index, i, cs.Region, len(x.regions))
		}
		d, err := x.regions[cs.Region].Seg(cs.Offset, uint64(cs.Len))
		if err != nil {
			return segs, codeErr(wire.CodeOutOfRange, "chunk %d segment %d: %w", ch.Index, i, err)
		}
		segs = append(segs, d)
	}
	x.inflight++
	return segs, nil
}

var errFinished = fmt.Errorf("transfer already finished")

// landed records a chunk on the device, acks it, and completes the
// transfer when every chunk is there.
func (x *inXfer) landed(idx uint32, n uint64, err error) {
	if err != nil {
		x.fail(codeErr(wire.CodeDevice, "scatter chunk %d to %s: %w", idx, x.s.dev, err), true)
		return
	}
	x.mu.Lock()
	if x.finished {
		// A second copy of a chunk that landed (sent again after a stream
		// loss) is answered with nothing: the first copy's Ack returned
		// the credit. Any other chunk of a finished transfer returns its
		// credit, unless it took none.
		dup := x.hasLocked(idx)
		quiet := x.inline || x.ring || dup
		x.mu.Unlock()
		if dup {
			x.ss.link.Duplicates.Add(1)
		}
		if !quiet {
			x.ss.send(&wire.Credit{Grant: 1})
		}
		return
	}
	x.progress = time.Now()
	if x.hasLocked(idx) {
		x.mu.Unlock()
		x.ss.link.Duplicates.Add(1)
		return // a second copy: landed again (same bytes), answered once
	}
	x.bits[idx/64] |= uint64(1) << (idx % 64)
	x.nLanded++
	x.bytes += n
	if x.local != nil {
		x.local.addDone(x.bytes) // our pull: XferStatus.Done counts landed bytes
	}
	complete := x.nLanded == x.count
	var bad error
	if complete && x.bytes != x.total {
		bad = codeErr(wire.CodeMalformed, "all %d chunks landed but they carried %d B, not the %d B announced", x.count, x.bytes, x.total)
	}
	if complete && bad == nil {
		x.finished = true
	}
	ring, ackOn := x.ring, x.ackOn
	x.mu.Unlock()
	if !ring {
		if ds := ackOn; ds != nil {
			var b [64]byte
			ds.sendCtl(wire.AppendFrame(b[:0], &wire.Ack{Transfer: x.wireID, Chunks: []uint32{idx}}, false, 0))
		} else {
			x.ss.send(&wire.Ack{Transfer: x.wireID, Chunks: []uint32{idx}})
		}
	}
	if bad != nil {
		x.fail(bad, true)
		return
	}
	if complete {
		x.done(nil)
	}
}

// hasLocked reports whether chunk idx landed already (x.mu held).
func (x *inXfer) hasLocked(idx uint32) bool {
	return idx < x.count && x.bits[idx/64]&(uint64(1)<<(idx%64)) != 0
}

// has is hasLocked for callers without x.mu.
func (x *inXfer) has(idx uint32) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.hasLocked(idx)
}

// fail ends the transfer with err; tellPeer sends a Nack.
func (x *inXfer) fail(err error, tellPeer bool) {
	x.mu.Lock()
	if x.finished {
		x.mu.Unlock()
		return
	}
	x.finished = true
	x.mu.Unlock()
	if tellPeer {
		x.ss.send(&wire.Nack{Transfer: x.wireID, Code: errCode(err), Message: err.Error()})
	}
	x.done(err)
}

// done runs once when the transfer finished (x.finished already set).
func (x *inXfer) done(err error) {
	ss, s := x.ss, x.s
	x.mu.Lock()
	var bits []uint64 // no longer written: x is finished
	if err != nil && x.local == nil && x.nLanded > 0 && !x.inline && !x.ring {
		bits = x.bits
	}
	x.mu.Unlock()
	ss.mu.Lock()
	if ss.in[x.wireID] == x {
		delete(ss.in, x.wireID)
	}
	if x.local == nil || err == nil {
		ss.buryLocked(x.wireID, err == nil)
		ss.keepBitsLocked(x.wireID, bits)
	}
	ss.mu.Unlock()
	x.mu.Lock()
	bytes := x.bytes
	x.mu.Unlock()
	if x.local != nil {
		x.local.addDone(bytes)
		s.finishLocal(x.local, err)
	} else {
		if err == nil {
			ss.link.XfersOK.Add(1)
		} else {
			ss.link.XfersFailed.Add(1)
			s.log.Warn("incoming transfer failed", zap.String("peer", ss.peerName), zap.Uint64("transfer", x.wireID), zap.String("tag", x.tag), zap.Error(err))
		}
		n := &wire.Notify{Transfer: x.wireID, Peer: ss.peerName, Route: routeName(ss), Tag: x.tag, Dir: x.dir, Bytes: bytes}
		x.kvn.fill(n)
		if err != nil {
			n.Code, n.Message = errCode(err), err.Error()
		}
		s.notify(n)
	}
	x.maybeRelease()
}

// release drops the inflight reference taken by resolve.
func (x *inXfer) release() {
	x.mu.Lock()
	x.inflight--
	x.mu.Unlock()
	x.maybeRelease()
}

// maybeRelease lets go of the regions once finished and nothing in flight.
func (x *inXfer) maybeRelease() {
	x.mu.Lock()
	rel := x.finished && x.inflight == 0 && !x.released
	if rel {
		x.released = true
	}
	x.mu.Unlock()
	if rel {
		region.ReleaseAll(x.regions)
	}
}

func routeName(ss *session) string {
	if ss.route != nil {
		return ss.route.Name()
	}
	return ""
}

// checkStalled fails incoming transfers with no progress for their timeout.
func (ss *session) checkStalled(now time.Time) {
	ss.mu.Lock()
	var stale []*inXfer
	var errs []error
	for _, x := range ss.in {
		x.mu.Lock()
		if x.timeout > 0 && now.Sub(x.progress) > x.timeout {
			// Counted under x.mu: a data stream's first chunk sets
			// x.count under it.
			stale = append(stale, x)
			errs = append(errs, codeErr(wire.CodeTimeout, "no chunk landed for %v (%d of %d chunks)", x.timeout, x.nLanded, x.count))
		}
		x.mu.Unlock()
	}
	ss.mu.Unlock()
	for i, x := range stale {
		x.fail(errs[i], true)
	}
}

// damaged handles a chunk whose CRC32C did not match: nothing of it lands,
// and the peer is asked to send it again with Resend, which also returns
// the chunk's credit (the sender gives up after staging.MaxResends and
// fails the transfer). A damaged second copy of a chunk that landed
// already is answered with nothing, like any second copy.
func (ss *session) damaged(x *inXfer, ch *wire.Chunk, got, want uint32) {
	ss.link.ChecksumErrors.Add(1)
	ss.s.log.Warn("chunk arrived damaged; asking the peer to send it again", zap.String("peer", ss.peerName),
		zap.Uint64("transfer", ch.Transfer), zap.Uint32("chunk", ch.Index),
		zap.String("crc32c", fmt.Sprintf("%08x, header says %08x", got, want)))
	if x.has(ch.Index) {
		return
	}
	x.mu.Lock()
	x.progress = time.Now()
	x.mu.Unlock()
	ss.send(&wire.Resend{Transfer: ch.Transfer, Chunk: ch.Index})
}

// secondCopy reports whether a chunk that will not land (x nil: its
// transfer is unknown or gone; else resolve's error lerr) is a second copy
// of one that landed already, which is answered with nothing: the first
// copy's Ack returned its credit.
func (ss *session) secondCopy(x *inXfer, lerr error, ch *wire.Chunk) bool {
	if x == nil {
		ss.mu.Lock()
		landed := ss.landedGoneLocked(ch.Transfer, ch.Index)
		ss.mu.Unlock()
		return landed
	}
	return lerr == errFinished && x.has(ch.Index)
}
