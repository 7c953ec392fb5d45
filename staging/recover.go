package staging

import "fmt"

// Recovery: what the core does when a chunk may not have arrived (its
// stream was lost or its write failed: send it again and give its credit
// back) or arrived damaged (the receiver's Resend: send it again, up to
// MaxResends per transfer). A chunk may then reach the receiver twice;
// the receiver lands it once and answers it once, and the core returns
// each copy's credit exactly once (see answer.go).

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
			if st == chSent && int(x.onStream[c]) == stream+1 {
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
	x.sess.credits++
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
