package proxy

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// inbound is a session's receiving half: the transfers whose chunks land
// here (a peer's push, our pull) and the receive core that decides about
// them (staging.Receiver: credits, duplicates, tombstones), under a lock
// of its own. Its methods step the core under that lock and perform what
// it returned (frames on the session, completions, regions let go of)
// after letting go; the chunk readers, the control session's handlers,
// the same-node paths and the loop's tick all come through here.
//
// Lock order: inbound.mu is a leaf. Nothing else is locked while it is
// held (frames are sent after it is let go of), and no caller holds
// session.mu or the answer table's lock when it takes it.
type inbound struct {
	ss       *session
	mu       sync.Mutex
	byID     map[uint64]*inXfer // open transfers, by wire id
	rx       *staging.Receiver  // the receive core: rules and tombstones of byID
	announce *sync.Cond         // signalled when byID or rx's tombstones change (on mu)
	closed   bool               // the session closed (RxClose stepped): no chunk waits any more
	// parked are peers' KV pushes held for their grant (kvpark.go), each
	// until when at most: their overtaking chunks wait as long.
	parked map[uint64]time.Time
}

func newInbound(ss *session, maxPerPeer int) *inbound {
	in := &inbound{ss: ss, byID: map[uint64]*inXfer{}, rx: staging.NewReceiver(maxPerPeer), parked: map[uint64]time.Time{}}
	in.announce = sync.NewCond(&in.mu)
	return in
}

// stepLocked steps the receive core (in.mu held) and keeps byID, the
// open transfers, in step with it.
func (in *inbound) stepLocked(ev staging.RecvEvent, x *inXfer, o *recvOut) {
	if ev.Now.IsZero() {
		ev.Now = time.Now()
	}
	in.rx.Step(ev, &o.RecvReady)
	o.x = x
	changed := ev.Kind == staging.RxRefused || ev.Kind == staging.RxClose || len(o.Done) > 0
	if ev.Kind == staging.RxOpen && o.Err == nil {
		in.byID[ev.Transfer] = x
		changed = true
	}
	if ev.Kind == staging.RxClose {
		in.closed = true
	}
	for _, d := range o.Done {
		o.done = append(o.done, in.byID[d.Transfer])
		delete(in.byID, d.Transfer)
	}
	if changed {
		in.announce.Broadcast() // incoming waits on byID and the tombstones
	}
}

// stepIfCurrent steps the receive core with ev about x, unless x is no longer
// what byID holds for the chunk's id (it was opened or ended since the
// caller looked): then it reports false and steps nothing.
func (in *inbound) stepIfCurrent(ev staging.RecvEvent, x *inXfer, o *recvOut) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.byID[ev.Transfer] != x {
		return false
	}
	in.stepLocked(ev, x, o)
	return true
}

// recv steps the receive core with ev about x (nil when the caller has no
// transfer) and performs what it returned. The error is the core's
// refusal (RecvReady.Err).
func (in *inbound) recv(ev staging.RecvEvent, x *inXfer) error {
	o := recvOuts.Get().(*recvOut)
	in.mu.Lock()
	in.stepLocked(ev, x, o)
	in.mu.Unlock()
	in.perform(o)
	err := o.Err
	o.reset()
	recvOuts.Put(o)
	return err
}

// close fails every incoming transfer with err (the session closed); o
// gets the core's output, for the caller to perform.
func (in *inbound) close(err error, o *recvOut) {
	in.mu.Lock()
	in.stepLocked(staging.RecvEvent{Kind: staging.RxClose, Err: err}, nil, o)
	in.mu.Unlock()
}

// perform does what the core decided, in its order (staging.RecvReady).
func (in *inbound) perform(o *recvOut) {
	ss := in.ss
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
			x.use.end()
		}
	}
}

// open registers x, checked, with the receive core.
func (in *inbound) open(x *inXfer) error {
	return recvErr(in.recv(staging.RecvEvent{Kind: staging.RxOpen, Transfer: x.wireID, Total: x.total, Timeout: x.timeout,
		Pull: x.pull(), Inline: x.ackOn != nil}, x))
}

// lookup is the open transfer with wire id wireID, if any.
func (in *inbound) lookup(wireID uint64) *inXfer {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.byID[wireID]
}

// list is a snapshot of the open transfers.
func (in *inbound) list() []*inXfer {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Collect(maps.Values(in.byID))
}

// count is the number of open transfers.
func (in *inbound) count() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.byID)
}

// tick fails incoming transfers with no progress for their timeout (the
// sender loop's tick).
func (in *inbound) tick(now time.Time) {
	in.recv(staging.RecvEvent{Kind: staging.RxTick, Now: now}, nil)
}

// damaged handles a chunk whose CRC32C did not match: nothing of it lands;
// the core asks the peer to send it again (Resend), or answers nothing
// for a second copy of a chunk that landed already.
func (in *inbound) damaged(x *inXfer, ch *wire.Chunk, got, want uint32) {
	ss := in.ss
	ss.link.ChecksumErrors.Add(1)
	ss.s.log.Warn("chunk arrived damaged; asking the peer to send it again", zap.String("peer", ss.peerName),
		zap.Uint64("transfer", ch.Transfer), zap.Uint32("chunk", ch.Index),
		zap.String("crc32c", fmt.Sprintf("%08x, header says %08x", got, want)))
	in.recv(staging.RecvEvent{Kind: staging.RxDamaged, Transfer: x.wireID, Chunk: ch.Index}, x)
}

// announceWait is how long a chunk that arrived ahead of its transfer's
// Announce waits for it. The sender starts sending right after it queued
// the Announce, on another connection, so the two may cross.
const announceWait = time.Second

// incoming finds the open transfer a chunk belongs to, waiting briefly
// for an Announce that has not arrived yet; nil for a finished, refused
// or unknown transfer (the core then decides the chunk's answer).
func (in *inbound) incoming(wireID uint64) *inXfer {
	in.mu.Lock()
	defer in.mu.Unlock()
	if x := in.byID[wireID]; x != nil {
		return x
	}
	if in.ss.ours(wireID) {
		return nil // our pull: opened before the request went out
	}
	deadline := time.Now().Add(announceWait)
	timer := time.AfterFunc(announceWait, func() {
		in.mu.Lock()
		in.announce.Broadcast()
		in.mu.Unlock()
	})
	defer timer.Stop()
	for {
		if x := in.byID[wireID]; x != nil {
			return x
		}
		if until, ok := in.parked[wireID]; ok && until.After(deadline) {
			deadline = until // unpark wakes us
		}
		if in.rx.State(wireID) == staging.RecvGone || in.closed || !time.Now().Before(deadline) {
			return nil
		}
		in.announce.Wait()
	}
}

// park holds a peer's push id, announced and not yet admitted, until at
// most until: chunks of it that arrive meanwhile wait for its verdict.
// False when max are held already.
func (in *inbound) park(wireID uint64, until time.Time, max int) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed || len(in.parked) >= max {
		return false
	}
	in.parked[wireID] = until
	return true
}

// unpark ends park's hold, once the push was opened or refused.
func (in *inbound) unpark(wireID uint64) {
	in.mu.Lock()
	delete(in.parked, wireID)
	in.announce.Broadcast()
	in.mu.Unlock()
}
