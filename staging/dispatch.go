package staging

// Handing gathered chunks to data streams. A gathered chunk goes to the
// least loaded live stream (balance.go says by what). With a queue set
// (staging.stream_queue), only while that stream has fewer than queue
// chunks handed to it and not yet written (2: one in the writer's hands,
// one behind it, so a writer never waits for the core between two writes);
// otherwise it waits here, oldest first, for the first stream to free.
//
// Why: gathering runs staging.stream_depth chunks per stream ahead, and
// without a queue each socket gets that many chunks behind it at once.
// Streams drain at different rates, so at the end of a transfer fast ones
// idle while slow ones still have chunks to write: execution traces on two
// H200s showed the last 3-4 ms of a 50 ms, 1 GiB transfer on fewer than
// all eight streams (docs/BENCHMARKS.md, "The one-transfer rows, traced").
// A Sender starts with no queue, the rule before this file and still the
// sidecar's default: a queue of 2 did not move the one-transfer rows
// beyond their run-to-run spread there, because most of what is left at a
// transfer's end sits in the sockets' buffers, past the sender's choice.

// gathered is a chunk in its send slot, waiting for a stream with room.
type gathered struct {
	x     *sxfer
	chunk uint32
	slot  SendSlot
}

// SetStreamQueue sets how many chunks one stream may hold unwritten; 0
// means no limit (every gathered chunk goes to a stream at once).
func (s *Sender) SetStreamQueue(n int) { s.queue = max(0, n) }

// enqueueGathered hands gathered chunk c of x, in slot, to a stream with
// room, or queues it behind the chunks already waiting.
func (s *Sender) enqueueGathered(x *sxfer, c uint32, slot SendSlot) {
	ss := x.sess
	st, alive := s.roomyStream(ss)
	if !alive {
		ss.ahead--
		s.refund(ss)
		s.release(x, slot)
		s.fail(x, ErrNoStreams)
		return
	}
	if st >= 0 && len(ss.waiting) == 0 {
		s.sendOn(x, c, slot, st)
		return
	}
	ss.waiting = append(ss.waiting, gathered{x: x, chunk: c, slot: slot})
}

// dispatchAll hands waiting chunks to streams that have room (a write
// completed, a stream came back).
// Without a queue nothing ever waits (enqueueGathered hands every chunk
// over), so the default costs one test per Step.
func (s *Sender) dispatchAll() {
	if s.queue == 0 {
		return
	}
	for _, ss := range s.order {
		sent := 0
		for _, g := range ss.waiting {
			st, _ := s.roomyStream(ss)
			if st < 0 {
				break
			}
			s.sendOn(g.x, g.chunk, g.slot, st)
			sent++
		}
		if sent > 0 {
			// Shift the rest to the front: the array stays, no allocation
			// per burst (at most depth x streams chunks wait).
			n := copy(ss.waiting, ss.waiting[sent:])
			clear(ss.waiting[n:])
			ss.waiting = ss.waiting[:n]
		}
	}
}

// roomyStream picks the stream of ss for a gathered chunk (pickStream),
// reading its sockets first when balancing on their bytes; -1 when every
// live one holds s.queue; alive is false when none lives.
func (s *Sender) roomyStream(ss *ssess) (best int, alive bool) {
	if s.probe != nil && len(ss.streams) > 1 {
		s.readSockets(ss)
	}
	return pickStream(ss.streams, s.probe != nil, s.queue)
}

// sendOn emits the write of chunk c of x, in slot, on stream st.
func (s *Sender) sendOn(x *sxfer, c uint32, slot SendSlot, st int) {
	ss := x.sess
	ss.streams[st].inflight++
	ss.streams[st].unsent += uint64(x.plan.ChunkLen(int(c)))
	if x.state[c] == chCopying {
		x.state[c] = chSending
	}
	x.onStream[c] = uint16(st + 1)
	s.ready.Sends = append(s.ready.Sends, SendCmd{Session: ss.id, Stream: st, Transfer: x.id, Chunk: c,
		Count: uint32(x.plan.Len()), Slot: slot, C: x.plan.Chunk(int(c))})
}

// dropWaiting gives up x's waiting chunks (x is finishing): their slots
// and credits come back, and they count as never gathered.
func (s *Sender) dropWaiting(x *sxfer) {
	ss := x.sess
	if len(ss.waiting) == 0 {
		return
	}
	keep := ss.waiting[:0]
	for _, g := range ss.waiting {
		if g.x != x {
			keep = append(keep, g)
			continue
		}
		ss.ahead--
		s.refund(ss)
		if x.state[g.chunk] == chCopying {
			x.state[g.chunk] = chPending
		}
		s.release(x, g.slot)
	}
	clear(ss.waiting[len(keep):])
	ss.waiting = keep
}
