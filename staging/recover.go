package staging

import "fmt"

// Recovery: what the core does when a chunk may not have arrived (its
// stream was lost or its write failed: send it again and give its credit
// back) or arrived damaged (the receiver's Resend: send it again, up to
// MaxResends per transfer). A chunk may then reach the receiver twice;
// the receiver lands it once and answers it once, and the core returns
// each copy's credit exactly once (see creditGiven).

func (s *Sender) streamLost(ss *ssess, stream int, err error) {
	if stream < 0 || stream >= len(ss.streams) || !ss.streams[stream].alive {
		return
	}
	ss.streams[stream].alive = false
	alive := false
	for _, st := range ss.streams {
		alive = alive || st.alive
	}
	if !alive {
		if err == nil {
			err = ErrNoStreams
		} else {
			err = fmt.Errorf("%w (last: %v)", ErrNoStreams, err)
		}
		for len(ss.active) > 0 {
			s.fail(ss.active[0], err)
		}
		return
	}
	// Chunks written on the lost stream and not yet acked may never have
	// arrived: send them again and give back the credit they took.
	for _, x := range ss.active {
		for c, st := range x.state {
			if st == chSent && int(x.onStream[c]) == stream {
				s.resendLost(x, uint32(c))
			}
		}
	}
}

// resendLost queues sent chunk c of x again, its copy on a lost stream
// unanswered, and gives back the credit that copy took.
func (s *Sender) resendLost(x *sxfer, c uint32) {
	s.taintChunk(x, c)
	x.redoChunk(c)
	x.refunded[c] = true
	x.sess.credits++
}

// resend handles the receiver's report that a chunk arrived damaged: the
// report returns the chunk's credit, and the chunk is gathered and sent
// again, up to MaxResends times per transfer.
func (s *Sender) resend(ev Event) {
	ss := s.sessions[ev.Session]
	if ss == nil {
		return
	}
	x := s.xfers[ev.Transfer]
	if !x.creditGiven(ss, ev.Chunk) {
		ss.credits++
	}
	if x == nil || x.finished || x.sess != ss || int(ev.Chunk) >= len(x.state) {
		return
	}
	if st := x.state[ev.Chunk]; st != chSent && st != chSending {
		return // acked meanwhile, or already waiting to be sent again
	}
	s.answered(x, ev.Chunk) // the receiver read the whole copy to check it
	x.resends++
	if x.resends > MaxResends {
		s.fail(x, fmt.Errorf("%w: chunk %d of %d was damaged in transit; %d chunks of the transfer already sent again (the limit); check the network path or the peer's memory",
			ErrDamaged, ev.Chunk, x.plan.Len(), MaxResends))
		return
	}
	x.redoChunk(ev.Chunk)
	x.progress = s.now
}

// creditGiven reports whether an answer from session ss about chunk c of
// x must return no credit: the copy it answers was refunded already.
// x may be nil.
func (x *sxfer) creditGiven(ss *ssess, c uint32) bool {
	return x != nil && x.sess == ss && int(c) < len(x.refunded) && x.refunded[c] && x.state[c] == chPending
}

func (x *sxfer) redoChunk(c uint32) {
	x.state[c] = chPending
	x.redo = append(x.redo, c)
}

func (x *sxfer) dropRedo(c uint32) {
	for i, r := range x.redo {
		if r == c {
			x.redo = append(x.redo[:i], x.redo[i+1:]...)
			return
		}
	}
}

// refund gives back a credit taken by a chunk that will not arrive.
func (s *Sender) refund(ss *ssess) {
	if s.sessions[ss.id] == ss {
		ss.credits++
	}
}
