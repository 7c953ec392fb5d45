package staging

import (
	"errors"
	"slices"
)

// The receive core's rules, one event each (receiver.go says who calls).

// open admits a transfer. A peer's push is refused when its id is in use
// or was (a tombstone), the session closed, or maxLive transfers are
// open; our pull only when the session closed (our ids are unique, and
// a failed pull of ours leaves no tombstone).
func (r *Receiver) open(ev RecvEvent) error {
	if r.xfers[ev.Transfer] != nil || (!ev.Pull && r.gone.has(ev.Transfer)) {
		return ruleErr(ErrExists, "transfer %d already in progress or finished", ev.Transfer)
	}
	if r.closed {
		return ErrClosed
	}
	if !ev.Pull && r.live >= r.maxLive {
		return ruleErr(ErrBusy, "limits.max_transfers_per_peer (%d) reached", r.maxLive)
	}
	var x *rxfer
	if n := len(r.spare); n > 0 {
		x, r.spare = r.spare[n-1], r.spare[:n-1]
	} else {
		x = new(rxfer)
	}
	*x = rxfer{id: ev.Transfer, total: ev.Total, pull: ev.Pull, timeout: ev.Timeout, progress: r.now}
	if ev.Inline {
		x.path = pathInline
	}
	r.xfers[x.id] = x
	r.live++
	return nil
}

// check applies the rules every chunk meets before anything of it lands,
// and takes a hold on success: its transfer open; its count possible for
// the transfer's bytes and the same as its first chunk's (which sizes the
// landed bitmap); its index below the count; its segments inside the
// destination (ev.Err: the proxy checked them against its regions).
func (r *Receiver) check(x *rxfer, ev RecvEvent) error {
	if x == nil || x.finished {
		return ErrFinished
	}
	if x.count == 0 {
		if ev.Count == 0 || ev.Count > MaxRecvChunks || uint64(ev.Count) > x.total {
			return ruleErr(ErrMalformed, "chunk count %d is impossible for %d B", ev.Count, x.total)
		}
		x.count = ev.Count
		if words := (ev.Count + 63) / 64; words == 1 {
			x.bits = x.bit0[:]
		} else {
			x.bits = make([]uint64, words)
		}
	} else if ev.Count != x.count {
		return ruleErr(ErrMalformed, "chunk %d says %d chunks, earlier chunks said %d", ev.Chunk, ev.Count, x.count)
	}
	if ev.Chunk >= x.count {
		return ruleErr(ErrMalformed, "chunk index %d of %d", ev.Chunk, x.count)
	}
	if ev.Err != nil {
		return ev.Err
	}
	x.holds++
	return nil
}

// chunk decides a data stream's chunk: land it (a hold), or drain it.
// A drained chunk returns its credit (PROTOCOL 8.7) unless it took none
// (inline) or is a second copy of one that landed, whose first copy's Ack
// returned it; one that broke a rule fails its transfer, with a Nack.
func (r *Receiver) chunk(x *rxfer, ev RecvEvent) {
	err := r.check(x, ev)
	if err == nil && ev.Inline && ev.Count != 1 {
		x.holds--
		err = ruleErr(ErrMalformed, "inline chunk of transfer %d says %d chunks; an inline push has one", ev.Transfer, ev.Count)
	}
	if err == nil {
		r.out.Hold = true
		return
	}
	late := errors.Is(err, ErrFinished)
	if !ev.Inline && !(late && r.landedBefore(x, ev.Transfer, ev.Chunk)) {
		r.out.Credits++
	}
	if !late {
		r.out.Err = err
		r.fail(x, err, true)
	}
}

// landedBefore reports whether chunk idx of a finished or unknown
// transfer had landed: by its bitmap while it is held, else by its
// tombstone.
func (r *Receiver) landedBefore(x *rxfer, id uint64, idx uint32) bool {
	if x != nil {
		return x.has(idx)
	}
	return r.gone.landed(id, idx)
}

// landed records a held chunk on the device: acked (but not a ring's,
// answered on the node connection) and counted once; the transfer
// completes when every chunk landed and they carried its announced bytes.
// A chunk landing after its transfer finished returns its credit unless
// it is a second copy or took none.
func (r *Receiver) landed(x *rxfer, ev RecvEvent) {
	if ev.Err != nil {
		r.fail(x, ev.Err, true)
		return
	}
	idx := ev.Chunk
	if x.finished {
		dup := x.has(idx)
		if dup {
			r.out.Duplicates++
		}
		if !x.quiet() && !dup {
			r.out.Credits++
		}
		return
	}
	x.progress = r.now
	if x.has(idx) {
		r.out.Duplicates++ // landed again (same bytes), answered once
		return
	}
	x.bits[idx/64] |= uint64(1) << (idx % 64)
	x.nLanded++
	x.bytes += ev.Bytes
	if x.pull {
		r.out.Progress = append(r.out.Progress, RecvProgress{Transfer: x.id, Bytes: x.bytes})
	}
	complete := x.nLanded == x.count
	var bad error
	if complete && x.bytes != x.total {
		bad = ruleErr(ErrMalformed, "all %d chunks landed but they carried %d B, not the %d B announced", x.count, x.bytes, x.total)
	}
	if x.path != pathRing {
		r.out.Acks = append(r.out.Acks, Answer{Transfer: x.id, Chunk: idx})
	}
	switch {
	case bad != nil:
		r.fail(x, bad, true)
	case complete:
		r.finish(x, nil)
	}
}

// damaged handles a held chunk whose CRC32C did not match: nothing of it
// landed. A pipeline chunk is asked for again with Resend, which returns
// its credit, unless it is a second copy of a landed one (answered with
// nothing). An inline one fails its transfer (ev.Err): the sender kept
// no copy to send again.
func (r *Receiver) damaged(x *rxfer, ev RecvEvent) {
	if ev.Inline {
		r.fail(x, ev.Err, true)
		return
	}
	if x.has(ev.Chunk) {
		return
	}
	x.progress = r.now
	r.out.Resends = append(r.out.Resends, Answer{Transfer: x.id, Chunk: ev.Chunk})
}

// direct completes a transfer whose n bytes were copied directly (a
// same-node path): no chunks, no answers.
func (r *Receiver) direct(x *rxfer, n uint64) error {
	if x == nil || x.finished {
		return ErrFinished
	}
	if n != x.total {
		return ruleErr(ErrMalformed, "direct copy of %d B, the transfer has %d B", n, x.total)
	}
	x.bytes, x.progress = n, r.now
	r.finish(x, nil)
	return nil
}

// fail ends x with err once; tellPeer adds a Nack.
func (r *Receiver) fail(x *rxfer, err error, tellPeer bool) {
	if x.finished {
		return
	}
	if tellPeer {
		r.out.Nacks = append(r.out.Nacks, RecvFailure{Transfer: x.id, Err: err})
	}
	r.finish(x, err)
}

// finish ends x: a tombstone for a peer's push (and for our pull that
// completed), with the landed bitmap of a failed pipeline push.
func (r *Receiver) finish(x *rxfer, err error) {
	x.finished = true
	r.live--
	if !x.pull || err == nil {
		r.gone.bury(x.id, err == nil)
		if err != nil && x.nLanded > 0 && x.path == pathPipeline {
			r.gone.keepBits(x.id, slices.Clone(x.bits)) // x's own go with it (maybeRetire)
		}
	}
	r.out.Done = append(r.out.Done, RecvDone{Transfer: x.id, Bytes: x.bytes, Err: err})
	r.maybeRetire(x)
}

// maybeRetire forgets a finished transfer no chunk holds, keeping its
// record for reuse: nothing refers to it once it left r.xfers.
func (r *Receiver) maybeRetire(x *rxfer) {
	if x.finished && x.holds == 0 {
		delete(r.xfers, x.id)
		r.out.Released = append(r.out.Released, x.id)
		if len(r.spare) < maxSpare {
			*x = rxfer{}
			r.spare = append(r.spare, x)
		}
	}
}

// tick fails the open transfers with no progress for their timeout.
func (r *Receiver) tick() {
	var stale []*rxfer
	for _, x := range r.xfers {
		if !x.finished && x.timeout > 0 && r.now.Sub(x.progress) > x.timeout {
			stale = append(stale, x)
		}
	}
	sortXfers(stale)
	for _, x := range stale {
		r.fail(x, ruleErr(ErrTimeout, "no chunk landed for %v (%d of %d chunks)", x.timeout, x.nLanded, x.count), true)
	}
}
