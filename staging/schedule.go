package staging

// Scheduling: which chunk of which transfer starts next, round robin over
// sessions and over each session's transfers, within slots, credits and
// staging.stream_depth.

// schedule starts copies while slots and credits allow, round robin over
// sessions and, within a session, over its transfers.
func (s *Sender) schedule() {
	for len(s.free) > 0 && len(s.order) > 0 {
		started := false
		for i := 0; i < len(s.order) && len(s.free) > 0; i++ {
			ss := s.order[(s.rr+i)%len(s.order)]
			if ss.credits <= 0 || len(ss.active) == 0 || !s.roomAhead(ss) {
				continue
			}
			if s.startOne(ss) {
				started = true
			}
		}
		s.rr++
		if !started {
			return
		}
	}
}

// roomAhead reports whether ss may have one more chunk gathered ahead of
// its sockets.
func (s *Sender) roomAhead(ss *ssess) bool {
	if s.depth <= 0 {
		return true
	}
	alive := 0
	for _, st := range ss.streams {
		if st.alive {
			alive++
		}
	}
	return ss.ahead < s.depth*max(alive, 1)
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
		case x.next < x.plan.Len():
			c = uint32(x.next)
			x.next++
		default:
			continue
		}
		slot := s.free[len(s.free)-1]
		s.free = s.free[:len(s.free)-1]
		x.refunded[c] = false
		ss.credits--
		ss.ahead++
		x.busy++
		x.state[c] = chCopying
		ss.rr = k + 1
		s.ready.Copies = append(s.ready.Copies, CopyCmd{Transfer: x.id, Chunk: c, Slot: slot, C: x.plan.Chunk(int(c))})
		return true
	}
	return false
}
