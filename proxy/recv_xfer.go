package proxy

import (
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// Incoming transfers: a peer's push, or our pull. Whether a chunk lands,
// how it is answered and when a transfer ends are the receive core's to
// decide (staging.Receiver: credits, duplicates, tombstones), which the
// session's inbound half (recv_inbound.go) steps under its own lock.

// inXfer is a transfer whose chunks land here.
type inXfer struct {
	s       *Server
	ss      *session
	wireID  uint64
	tag     string
	regions []*region.Region // destination regions (references held)
	total   uint64
	dest    inDest // where its chunks land: bytes or KV rows (recv_dest.go)
	end     inEnd  // whom its progress and end concern: ourPull or peerPush
	timeout time.Duration
	ackOn   *dataStream // an inline push: acks go on this data stream, not the control session
	use     *grantUse   // a KV push admitted under a transfer key: ended once its regions are let go (kvfence.go)
}

// inEnd is whom an incoming transfer's progress and end concern: the
// engine of our pull, or the subscribers of a peer's push.
type inEnd interface {
	progress(bytes uint64) // bytes landed so far
	finish(x *inXfer, bytes uint64, err error)
}

// ourPull is the engine's transfer of our pull: its XferStatus.Done
// counts landed bytes, and its end answers the engine.
type ourPull struct{ lx *localXfer }

func (p ourPull) progress(bytes uint64) { p.lx.addDone(bytes) }

func (p ourPull) finish(x *inXfer, bytes uint64, err error) {
	p.lx.addDone(bytes)
	x.s.finishLocal(p.lx, err)
}

// peerPush is a peer's push: its end is told to the subscribers (Notify),
// with what landed of a KV push (kvn; nil for bytes).
type peerPush struct{ kvn *kvNote }

func (peerPush) progress(uint64) {}

func (p peerPush) finish(x *inXfer, bytes uint64, err error) {
	ss, s := x.ss, x.s
	if err == nil {
		ss.link.XfersOK.Add(1)
	} else {
		ss.link.XfersFailed.Add(1)
		s.log.Warn("incoming transfer failed", zap.String("peer", ss.peerName), zap.Uint64("transfer", x.wireID), zap.String("tag", x.tag), zap.Error(err))
	}
	n := &wire.Notify{Transfer: x.wireID, Peer: ss.peerName, Route: routeName(ss), Tag: x.tag, Dir: wire.Push, Bytes: bytes}
	p.kvn.fill(n)
	if err != nil {
		n.Code, n.Message = errCode(err), err.Error()
	}
	s.notify(n, x.regions)
}

// recvOut is what one step of a session's receive core returned, with the
// transfers it names.
type recvOut struct {
	staging.RecvReady
	x    *inXfer   // the transfer the event named, when the caller had it
	done []*inXfer // the transfer of each Done, in order
	// An inline push's Ack, framed here (inbound.perform): reused with o.
	ack   wire.Ack
	frame []byte
}

// recvOuts recycles the outputs of inbound.recv: a warm one's slices
// keep their arrays, so a step allocates nothing (a small push steps the
// core three times).
var recvOuts = sync.Pool{New: func() any { return new(recvOut) }}

// reset empties o for reuse, keeping its slices' arrays but nothing they
// pointed at.
func (o *recvOut) reset() {
	clear(o.done)
	clear(o.Nacks)
	clear(o.Done)
	o.RecvReady.Reset()
	o.x, o.done = nil, o.done[:0]
}

// find is the transfer id of an output names.
func (o *recvOut) find(id uint64) *inXfer {
	if o.x != nil && o.x.wireID == id {
		return o.x
	}
	for _, x := range o.done {
		if x != nil && x.wireID == id {
			return x
		}
	}
	return nil
}

// recvErr gives the receive core's errors their wire codes; errors the
// proxy handed it (a device's) have theirs, and ErrFinished stays itself.
func recvErr(err error) error {
	if _, ok := err.(*status.Error); ok || err == nil || errors.Is(err, staging.ErrFinished) {
		return err
	}
	switch {
	case errors.Is(err, staging.ErrMalformed):
		return codeErr(wire.CodeMalformed, "%w", err)
	case errors.Is(err, staging.ErrTimeout):
		return codeErr(wire.CodeTimeout, "%w", err)
	case errors.Is(err, staging.ErrExists):
		return codeErr(wire.CodeExists, "%w", err)
	case errors.Is(err, staging.ErrBusy):
		return codeErr(wire.CodeBusy, "%w", err)
	case errors.Is(err, staging.ErrClosed):
		return errSessionGone
	}
	return codeErr(errCode(err), "%w", err)
}

// pull reports whether x is our pull (else a peer's push).
func (x *inXfer) pull() bool {
	_, ok := x.end.(ourPull)
	return ok
}

// resolve checks a ring chunk (proxy/node, shm.go) and appends where it
// lands to segs. On success the caller holds the transfer until release.
func (x *inXfer) resolve(ch *wire.Chunk, segs []device.Seg) ([]device.Seg, error) {
	var l landing
	serr := x.dest.check(ch, &l)
	if err := x.ss.in.recv(staging.RecvEvent{Kind: staging.RxCheck, Transfer: x.wireID, Chunk: ch.Index, Count: ch.Count, Err: serr}, x); err != nil {
		return segs, recvErr(err)
	}
	return x.dest.segs(ch, &l, segs), nil
}

// landed records the scatter of chunk idx of n bytes: on the device (err
// nil), or failed.
func (x *inXfer) landed(idx uint32, n uint64, err error) {
	if err != nil {
		err = codeErr(wire.CodeDevice, "scatter chunk %d to %s: %w", idx, x.s.dev, err)
	}
	x.ss.in.recv(staging.RecvEvent{Kind: staging.RxLanded, Transfer: x.wireID, Chunk: idx, Bytes: n, Err: err}, x)
}

// release drops a chunk's hold on x.
func (x *inXfer) release() {
	x.ss.in.recv(staging.RecvEvent{Kind: staging.RxRelease, Transfer: x.wireID}, x)
}

// fail ends the transfer with err; tellPeer sends a Nack.
func (x *inXfer) fail(err error, tellPeer bool) {
	x.ss.in.recv(staging.RecvEvent{Kind: staging.RxFail, Transfer: x.wireID, Err: err, TellPeer: tellPeer}, x)
}

// touch records progress (a direct copy is under way).
func (x *inXfer) touch() {
	x.ss.in.recv(staging.RecvEvent{Kind: staging.RxTouch, Transfer: x.wireID}, x)
}

// viaRing marks x as landing through a shared ring: its chunks are
// answered on the node connection, with neither Ack nor Credit.
func (x *inXfer) viaRing() {
	x.ss.in.recv(staging.RecvEvent{Kind: staging.RxViaRing, Transfer: x.wireID}, x)
}

// directLanded completes a transfer whose n bytes the peer (push) or we
// (pull) copied directly: no chunks, no acks.
func (x *inXfer) directLanded(n uint64) error {
	return recvErr(x.ss.in.recv(staging.RecvEvent{Kind: staging.RxDirect, Transfer: x.wireID, Bytes: n}, x))
}

func routeName(ss *session) string {
	if ss.route != nil {
		return ss.route.Name()
	}
	return ""
}
