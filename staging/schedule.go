package staging

// Scheduling: which chunk of which transfer starts next, round robin over
// sessions and over each session's transfers, within slots, credits and
// staging.stream_depth.

// schedule starts copies while slots and credits allow, round robin over
// sessions and, within a session, over its transfers, each session within
// its fair share of the slots (fair.go): sessions under their share are
// served first; only when none of them can start anything may the others
// borrow, and never the reserve.
func (s *Sender) schedule() {
	for len(s.free) > 0 && len(s.order) > 0 {
		n := 0
		for _, ss := range s.order {
			if s.wants(ss) {
				n++
			}
		}
		if n == 0 {
			return
		}
		usable := s.slots - s.broken
		share, reserve := FairShare(usable, n), Reserve(usable)
		started := s.round(share, -1)
		if !started {
			started = s.round(share, reserve)
		}
		s.rr++
		if !started {
			return
		}
	}
}

// round starts at most one chunk per session, in round-robin order: for
// sessions under share, or, when reserve >= 0, for any session that may
// borrow (MayTake). It reports whether anything started.
func (s *Sender) round(share, reserve int) bool {
	started := false
	for i := 0; i < len(s.order) && len(s.free) > 0; i++ {
		ss := s.order[(s.rr+i)%len(s.order)]
		if !s.wants(ss) {
			continue
		}
		if (reserve < 0 && ss.held >= share) || (reserve >= 0 && !MayTake(ss.held, len(s.free), share, reserve)) {
			continue
		}
		if s.startOne(ss) {
			started = true
		}
	}
	return started
}

// wants reports whether ss could start a chunk now if it had a slot.
func (s *Sender) wants(ss *ssess) bool {
	if ss.credits <= 0 || len(ss.active) == 0 || !s.roomAhead(ss) {
		return false
	}
	for _, x := range ss.active {
		if len(x.redo) > 0 || x.next < x.plan.Ready() {
			return true
		}
	}
	return false
}

// roomAhead reports whether ss may have one more chunk gathered ahead of
// its sockets.
func (s *Sender) roomAhead(ss *ssess) bool {
	if s.depth <= 0 {
		return true
	}
	return ss.ahead < s.depth*max(ss.aliveStreams(), 1)
}

// aliveStreams is the number of ss's live data streams.
func (ss *ssess) aliveStreams() int {
	n := 0
	for _, st := range ss.streams {
		if st.alive {
			n++
		}
	}
	return n
}

func (s *Sender) startOne(ss *ssess) bool {
	for i := 0; i < len(ss.active); i++ {
		k := (ss.rr + i) % len(ss.active)
		x := ss.active[k]
		var c uint32
		switch {
		case len(x.redo) > 0:
			c = x.redo[0]
			x.redo = x.redo[1:]
		case x.next < x.plan.Ready():
			c = uint32(x.next)
			x.next++
		default:
			continue
		}
		slot := s.free[len(s.free)-1]
		s.free = s.free[:len(s.free)-1]
		ss.credits--
		ss.ahead++
		ss.held++
		x.busy++
		x.state[c] = chCopying
		ss.rr = k + 1
		s.ready.Copies = append(s.ready.Copies, CopyCmd{Transfer: x.id, Chunk: c, Slot: slot, C: x.plan.Chunk(int(c))})
		return true
	}
	return false
}
