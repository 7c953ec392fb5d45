package staging

// Which stream a gathered chunk goes to. By default the live stream with
// the fewest chunks handed to its writer and not yet written. That count
// says nothing of what the writers already wrote: a socket takes up to
// its send buffer (4 MiB and more, autotuned) that the peer has not read,
// and streams drain at different rates, so at the end of a transfer one
// stream still holds megabytes while the others are empty
// (docs/BENCHMARKS.md, "The one-transfer rows, traced"). With a socket
// probe (staging.balance_sockets) the core instead weighs each stream by
// bytes: those its socket holds unacknowledged or unsent (SIOCOUTQ, read
// once per Step that places a chunk, for the session concerned) plus the
// payloads handed to its writer and not yet written; the chunk goes to the
// lightest. Reading the sockets is the proxy's (the probe); the choice is
// pickStream's, a pure function of what the core knows.

// SocketProbe reads how many bytes each data stream of session holds in
// its socket, written and not yet acknowledged by the peer: it fills
// queued[i] for stream i (queued has one entry per stream the core knows)
// and leaves 0 where it could not read one (no such stream, closing). It
// runs on the core's goroutine, inside Step.
type SocketProbe func(session uint64, queued []uint64)

// SetSocketProbe makes the core balance chunks on the bytes each stream
// holds, read with p; nil returns to balancing on unwritten chunks.
func (s *Sender) SetSocketProbe(p SocketProbe) { s.probe = p }

// SetTailChunk makes the core cut the end of every transfer it is given
// finer, down to chunks of n bytes (Plan.SplitTail); 0: not at all.
func (s *Sender) SetTailChunk(n uint32) { s.tail = n }

// readSockets refreshes the socket bytes of ss's streams, once per Step:
// chunks placed later in the same Step are counted in unsent.
func (s *Sender) readSockets(ss *ssess) {
	if ss.probed == s.steps {
		return
	}
	ss.probed = s.steps
	q := ss.sockBuf[:0]
	for range ss.streams {
		q = append(q, 0)
	}
	ss.sockBuf = q
	s.probe(ss.id, q)
	for i := range ss.streams {
		ss.streams[i].sock = q[i]
	}
}

// pickStream is the choice: among the live streams with room (fewer than
// queue unwritten chunks; any, when queue is 0), the one holding the
// fewest bytes (sock + unsent) when byBytes, else the fewest unwritten
// chunks; ties go to fewer unwritten chunks, then to the lower index.
// best is -1 when no live stream has room; alive is false when none
// lives.
func pickStream(streams []sstream, byBytes bool, queue int) (best int, alive bool) {
	best = -1
	for i := range streams {
		st := &streams[i]
		if !st.alive {
			continue
		}
		alive = true
		if queue > 0 && st.inflight >= queue {
			continue
		}
		if best < 0 || lighter(st, &streams[best], byBytes) {
			best = i
		}
	}
	return best, alive
}

// lighter reports whether a holds less than b.
func lighter(a, b *sstream, byBytes bool) bool {
	if byBytes {
		if la, lb := a.sock+a.unsent, b.sock+b.unsent; la != lb {
			return la < lb
		}
	}
	return a.inflight < b.inflight
}
