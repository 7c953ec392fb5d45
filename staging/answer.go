package staging

import "fmt"

// Answers: the receiver's Ack (the chunk landed) and Resend (it arrived
// damaged) each return the credit of the copy they answer. A copy's credit
// comes back exactly once: by its answer, or by the core when it gives the
// copy up (stream lost, write failed: recover.go). An answer about a chunk
// that does not exist, was never sent, or was answered or refunded already
// changes nothing (PROTOCOL 8.7): otherwise a peer could forge Acks to
// widen its own window past what it granted, or another peer's.

// owes reports whether an answer about chunk c of x returns a credit: a
// copy of c went on a stream (onStream is set) and its credit is still
// out. A chunk being gathered again (chCopying) after its earlier copy
// was given up owes it too: that copy's answer stands for the new copy,
// which the receiver, having the chunk, answers with nothing.
func (x *sxfer) owes(c uint32) bool {
	if int(c) >= len(x.state) || x.onStream[c] == 0 {
		return false
	}
	switch x.state[c] {
	case chSending, chSent, chCopying:
		return true
	}
	return false
}

func (s *Sender) ack(ev Event) {
	ss := s.sessions[ev.Session]
	if ss == nil {
		return
	}
	x := s.xfers[ev.Transfer]
	if x == nil || x.sess != ss {
		s.tombs.answer(ss, ev.Transfer, ev.Chunks)
		return
	}
	before := x.bytes
	for _, c := range ev.Chunks {
		if int(c) >= len(x.state) || x.onStream[c] == 0 || x.state[c] == chAcked {
			continue // never sent, or answered: no effect
		}
		if x.owes(c) {
			ss.credits++
		} // else refunded: it landed after all, its credit came back already
		if x.finished {
			x.state[c] = chAcked // its credit is back; nothing more to count
			continue
		}
		if x.state[c] == chPending {
			x.dropRedo(c)
		}
		x.state[c] = chAcked
		s.answered(x, c)
		x.acked++
		x.bytes += uint64(x.plan.ChunkLen(int(c)))
		x.progress = s.now
	}
	switch {
	case x.finished:
	case x.acked == x.plan.Len():
		s.finish(x, nil)
	case x.bytes != before:
		s.ready.Progress = append(s.ready.Progress, Progress{Transfer: x.id, Bytes: x.bytes})
	}
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
	if x == nil || x.sess != ss {
		s.tombs.answer(ss, ev.Transfer, []uint32{ev.Chunk})
		return
	}
	if !x.owes(ev.Chunk) {
		return // never sent, answered, or already waiting to go again
	}
	st := x.state[ev.Chunk]
	if st == chCopying {
		// About an earlier copy given up (its credit came back then); the
		// copy being gathered will be answered itself.
		return
	}
	ss.credits++
	if x.finished {
		x.state[ev.Chunk] = chPending
		return
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

// maxTombs bounds the retired transfers whose unanswered chunks the core
// remembers. An answer that comes after maxTombs later transfers retired
// returns nothing; its credit is lost (the receiver answers a chunk of a
// transfer it failed with a Credit instead, which always counts).
const maxTombs = 1024

// tombs remembers, for retired transfers that failed with copies on the
// wire, which chunks still owe a credit, so a late Ack returns it once.
type tombs struct {
	m     map[Key]*tomb
	order []Key // oldest first
}

type tomb struct {
	sess   *ssess
	chunks []uint32
}

// bury keeps x's owed chunks, if any, when x retires.
func (s *Sender) bury(x *sxfer) {
	if x.acked == len(x.state) {
		return
	}
	var owed []uint32
	for c := range x.state {
		if x.owes(uint32(c)) {
			owed = append(owed, uint32(c))
		}
	}
	if len(owed) == 0 {
		return
	}
	t := &s.tombs
	if t.m == nil {
		t.m = map[Key]*tomb{}
	}
	for len(t.order) >= maxTombs {
		delete(t.m, t.order[0])
		t.order = t.order[1:]
	}
	t.m[x.id] = &tomb{sess: x.sess, chunks: owed}
	t.order = append(t.order, x.id)
}

// answer returns a credit to ss for each of chunks that retired transfer
// id still owed it, once.
func (t *tombs) answer(ss *ssess, id Key, chunks []uint32) {
	tb := t.m[id]
	if tb == nil || tb.sess != ss {
		return
	}
	for _, c := range chunks {
		for i, o := range tb.chunks {
			if o == c {
				tb.chunks = append(tb.chunks[:i], tb.chunks[i+1:]...)
				ss.credits++
				break
			}
		}
	}
	if len(tb.chunks) == 0 {
		delete(t.m, id)
		for i, o := range t.order {
			if o == id {
				t.order = append(t.order[:i], t.order[i+1:]...)
				break
			}
		}
	}
}
