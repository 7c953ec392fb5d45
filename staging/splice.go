package staging

// Splice mode: a chunk written with vmsplice+splice leaves the kernel
// holding references to its slot's pages, not a copy of its bytes; on one
// host the receiver's receive queue may hold them too. Writing new bytes
// into the slot before the receiver has read the chunk would make it read
// those bytes under the old chunk's header. So:
//
//   - a slot whose chunk was spliced (EvWritten with Spliced) is held, not
//     freed, until the receiver proves it read that chunk: its Ack, or a
//     Resend (it read all of it to check the CRC); then it is freed;
//   - a held or spliced slot given up any other way (stream lost, transfer
//     failed, cancelled or timed out, session down, chunk sent again, a
//     write that failed part way) is tainted: reported in Ready.Taint and
//     kept out of the free list until the proxy gave it fresh pages
//     (EvRenewed);
//   - an answer proves only that some copy of the chunk was read. When an
//     earlier copy was given up unanswered (a ghost, still perhaps queued
//     in a socket), the answer may be the ghost's, so the held slot is
//     tainted rather than freed;
//   - the answer often comes before the writer's report: the receiver acks
//     as soon as it read the chunk, and its Ack reaches the core by another
//     path (the control session) than the writer's EvWritten. Such a slot
//     is freed when the report comes, on the same proof and with the same
//     ghost rule; tainting it cost a renewal (on CUDA an unregister, a
//     fresh mapping and a register, about 5 ms) for nearly every transfer.
//
// Credits are untouched by all this: they follow answers as before.

// hold keeps slot for spliced chunk c until the receiver answers it.
func (x *sxfer) hold(c uint32, slot SendSlot) {
	if x.held == nil {
		x.held = make([]int32, len(x.state))
		for i := range x.held {
			x.held[i] = -1
		}
	}
	x.held[c] = int32(slot)
}

// markGhost records that a copy of c was given up unanswered.
func (x *sxfer) markGhost(c uint32) {
	if x.ghost == nil {
		x.ghost = make([]bool, len(x.state))
	}
	x.ghost[c] = true
}

// answered lets go of c's held slot after the receiver's Ack or Resend:
// freed when that answer can only be about the held copy, else tainted.
func (s *Sender) answered(x *sxfer, c uint32) {
	if x.held == nil || x.held[c] < 0 {
		return
	}
	slot := SendSlot(x.held[c])
	x.held[c] = -1
	s.letGo(x, slot, x.hadGhost(c))
}

// answeredCopy reports whether the copy of c being let go is known to have
// been read: c was acked and no earlier copy was given up unanswered, so
// the Ack can only be about this one.
func (x *sxfer) answeredCopy(c uint32) bool {
	return int(c) < len(x.state) && x.state[c] == chAcked && !x.hadGhost(c)
}

// hadGhost reports whether a copy of c was given up unanswered, so an
// answer about c may be that copy's.
func (x *sxfer) hadGhost(c uint32) bool { return x.ghost != nil && x.ghost[c] }

// taintChunk gives up c's copy unanswered (its stream was lost): its held
// slot, if any, is tainted, and a later answer may be about that copy.
func (s *Sender) taintChunk(x *sxfer, c uint32) {
	x.markGhost(c)
	if x.held == nil || x.held[c] < 0 {
		return
	}
	slot := SendSlot(x.held[c])
	x.held[c] = -1
	s.letGo(x, slot, true)
}

// taintHeld gives up every held slot of x (x failed).
func (s *Sender) taintHeld(x *sxfer) {
	for c, slot := range x.held {
		if slot >= 0 {
			x.held[c] = -1
			s.letGo(x, SendSlot(slot), true)
		}
	}
}

// giveBack returns a slot to the free list, or a tainted one for renewal.
func (s *Sender) giveBack(slot SendSlot, tainted bool) {
	if tainted {
		s.renewing++
		s.ready.Taint = append(s.ready.Taint, slot)
		return
	}
	s.free = append(s.free, slot)
}

// renewed takes back a tainted slot: free again, or, when it could not get
// fresh pages, never used again.
func (s *Sender) renewed(ev Event) {
	if s.renewing == 0 {
		return // not ours to take: a duplicate report
	}
	s.renewing--
	if ev.Err != nil {
		s.broken++
		return
	}
	s.free = append(s.free, ev.Slot)
}

// Renewing is the number of tainted slots out for renewal.
func (s *Sender) Renewing() int { return s.renewing }

// Slots is the number of send slots the core can still use: all of them
// but those whose renewal failed. When nothing is in flight, FreeSlots
// equals Slots.
func (s *Sender) Slots() int { return s.slots - s.broken }
