package proxy

// socketBytes is the sender core's socket probe (staging.balance_sockets,
// staging/balance.go): for each data stream of the session, the bytes its
// socket holds that the peer has not acknowledged (rawconn.Queued: one
// ioctl). It runs on the sender loop, at most once per Step that places a
// chunk. A stream not attached, dead or closing counts 0: its loss reaches
// the core through its reader and writer, which is where it is reported.
func (sd *sender) socketBytes(session uint64, queued []uint64) {
	ss := sd.s.sessions.byID(session)
	if ss == nil {
		return
	}
	streams := ss.streams.snapshot(sd.sockStreams[:0])
	for i, ds := range streams {
		if i >= len(queued) {
			break
		}
		if ds == nil || ds.dead.Load() {
			continue
		}
		if n, err := ds.rc.Queued(); err == nil {
			queued[i] = n
		}
	}
	clear(streams) // hold no stream past the call
	sd.sockStreams = streams[:0]
}
