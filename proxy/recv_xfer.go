package proxy

import (
	"errors"
	"fmt"
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
// how it is answered and when a transfer ends are the session's receive
// core's to decide (staging.Receiver: credits, duplicates, tombstones);
// this file feeds it under the session's lock and performs what it
// returns (frames, completions, regions let go of) after letting go.

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
	// An inline push's Ack, framed here (performIn): reused with o.
	ack   wire.Ack
	frame []byte
}

// recvOuts recycles the outputs of session.recv: a warm one's slices
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

// stepIn steps the receive core (ss.mu held) and keeps ss.in, the open
// transfers, in step with it.
func (ss *session) stepIn(ev staging.RecvEvent, x *inXfer, o *recvOut) {
	if ev.Now.IsZero() {
		ev.Now = time.Now()
	}
	ss.rx.Step(ev, &o.RecvReady)
	o.x = x
	changed := ev.Kind == staging.RxRefused || ev.Kind == staging.RxClose || len(o.Done) > 0
	if ev.Kind == staging.RxOpen && o.Err == nil {
		ss.in[ev.Transfer] = x
		changed = true
	}
	for _, d := range o.Done {
		o.done = append(o.done, ss.in[d.Transfer])
		delete(ss.in, d.Transfer)
	}
	if changed {
		ss.announce.Broadcast() // incoming waits on ss.in and the tombstones
	}
}

// recv steps the receive core with ev about x (nil when the caller has no
// transfer) and performs what it returned. The error is the core's
// refusal (RecvReady.Err).
func (ss *session) recv(ev staging.RecvEvent, x *inXfer) error {
	o := recvOuts.Get().(*recvOut)
	ss.mu.Lock()
	ss.stepIn(ev, x, o)
	ss.mu.Unlock()
	ss.performIn(o)
	err := o.Err
	o.reset()
	recvOuts.Put(o)
	return err
}

// performIn does what the core decided, in its order (staging.RecvReady).
func (ss *session) performIn(o *recvOut) {
	for _, a := range o.Acks {
		if x := o.find(a.Transfer); x != nil && x.ackOn != nil {
			o.ack = wire.Ack{Transfer: a.Transfer, Chunks: append(o.ack.Chunks[:0], a.Chunk)}
			o.frame = wire.AppendFrame(o.frame[:0], &o.ack, false, 0)
			x.ackOn.sendCtl(o.frame) // copies it
		} else {
			ss.send(&wire.Ack{Transfer: a.Transfer, Chunks: []uint32{a.Chunk}})
		}
	}
	if o.Credits > 0 {
		ss.send(&wire.Credit{Grant: uint32(o.Credits)})
	}
	for _, r := range o.Resends {
		ss.send(&wire.Resend{Transfer: r.Transfer, Chunk: r.Chunk})
	}
	for _, n := range o.Nacks {
		err := recvErr(n.Err)
		ss.send(&wire.Nack{Transfer: n.Transfer, Code: errCode(err), Message: err.Error()})
	}
	if o.Duplicates > 0 {
		ss.link.Duplicates.Add(uint64(o.Duplicates))
	}
	for _, p := range o.Progress {
		if x := o.find(p.Transfer); x != nil {
			x.end.progress(p.Bytes)
		}
	}
	for i, d := range o.Done {
		if x := o.done[i]; x != nil {
			x.end.finish(x, d.Bytes, recvErr(d.Err))
		}
	}
	for _, id := range o.Released {
		if x := o.find(id); x != nil {
			region.ReleaseAll(x.regions)
		}
	}
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

// open registers x, checked, with the session's receive core.
func (ss *session) open(x *inXfer) error {
	return recvErr(ss.recv(staging.RecvEvent{Kind: staging.RxOpen, Transfer: x.wireID, Total: x.total, Timeout: x.timeout,
		Pull: x.pull(), Inline: x.ackOn != nil}, x))
}

// pull reports whether x is our pull (else a peer's push).
func (x *inXfer) pull() bool {
	_, ok := x.end.(ourPull)
	return ok
}

func (ss *session) lookupIn(wireID uint64) *inXfer {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.in[wireID]
}

// resolve checks a ring chunk (proxy/node, shm.go) and appends where it
// lands to segs. On success the caller holds the transfer until release.
func (x *inXfer) resolve(ch *wire.Chunk, segs []device.Seg) ([]device.Seg, error) {
	var l landing
	serr := x.dest.check(ch, &l)
	if err := x.ss.recv(staging.RecvEvent{Kind: staging.RxCheck, Transfer: x.wireID, Chunk: ch.Index, Count: ch.Count, Err: serr}, x); err != nil {
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
	x.ss.recv(staging.RecvEvent{Kind: staging.RxLanded, Transfer: x.wireID, Chunk: idx, Bytes: n, Err: err}, x)
}

// release drops a chunk's hold on x.
func (x *inXfer) release() {
	x.ss.recv(staging.RecvEvent{Kind: staging.RxRelease, Transfer: x.wireID}, x)
}

// fail ends the transfer with err; tellPeer sends a Nack.
func (x *inXfer) fail(err error, tellPeer bool) {
	x.ss.recv(staging.RecvEvent{Kind: staging.RxFail, Transfer: x.wireID, Err: err, TellPeer: tellPeer}, x)
}

// touch records progress (a direct copy is under way).
func (x *inXfer) touch() {
	x.ss.recv(staging.RecvEvent{Kind: staging.RxTouch, Transfer: x.wireID}, x)
}

// viaRing marks x as landing through a shared ring: its chunks are
// answered on the node connection, with neither Ack nor Credit.
func (x *inXfer) viaRing() {
	x.ss.recv(staging.RecvEvent{Kind: staging.RxViaRing, Transfer: x.wireID}, x)
}

// directLanded completes a transfer whose n bytes the peer (push) or we
// (pull) copied directly: no chunks, no acks.
func (x *inXfer) directLanded(n uint64) error {
	return recvErr(x.ss.recv(staging.RecvEvent{Kind: staging.RxDirect, Transfer: x.wireID, Bytes: n}, x))
}

func routeName(ss *session) string {
	if ss.route != nil {
		return ss.route.Name()
	}
	return ""
}

// tickIncoming fails incoming transfers with no progress for their
// timeout (the sender loop's tick).
func (ss *session) tickIncoming(now time.Time) {
	ss.recv(staging.RecvEvent{Kind: staging.RxTick, Now: now}, nil)
}

// damaged handles a chunk whose CRC32C did not match: nothing of it lands;
// the core asks the peer to send it again (Resend), or answers nothing
// for a second copy of a chunk that landed already.
func (ss *session) damaged(x *inXfer, ch *wire.Chunk, got, want uint32) {
	ss.link.ChecksumErrors.Add(1)
	ss.s.log.Warn("chunk arrived damaged; asking the peer to send it again", zap.String("peer", ss.peerName),
		zap.Uint64("transfer", ch.Transfer), zap.Uint32("chunk", ch.Index),
		zap.String("crc32c", fmt.Sprintf("%08x, header says %08x", got, want)))
	ss.recv(staging.RecvEvent{Kind: staging.RxDamaged, Transfer: x.wireID, Chunk: ch.Index}, x)
}

// announceWait is how long a chunk that arrived ahead of its transfer's
// Announce waits for it. The sender starts sending right after it queued
// the Announce, on another connection, so the two may cross.
const announceWait = time.Second

// incoming finds the open transfer a chunk belongs to, waiting briefly
// for an Announce that has not arrived yet; nil for a finished, refused
// or unknown transfer (the core then decides the chunk's answer).
func (ss *session) incoming(wireID uint64) *inXfer {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if x := ss.in[wireID]; x != nil {
		return x
	}
	if ss.ours(wireID) {
		return nil // our pull: opened before the request went out
	}
	deadline := time.Now().Add(announceWait)
	timer := time.AfterFunc(announceWait, func() {
		ss.mu.Lock()
		ss.announce.Broadcast()
		ss.mu.Unlock()
	})
	defer timer.Stop()
	for {
		if x := ss.in[wireID]; x != nil {
			return x
		}
		if ss.rx.State(wireID) == staging.RecvGone || ss.closed || !time.Now().Before(deadline) {
			return nil
		}
		ss.announce.Wait()
	}
}
