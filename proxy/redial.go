package proxy

import (
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/routing"
	"github.com/stage-kv/stage/staging"
)

// Redial of a lost data stream. The side that dialed the session dials a
// lost stream again, with the same index and a fresh DataHello proof,
// while the session lives and other streams still carry it (the last
// stream's loss closes the session, and the route dials a new one). The
// acceptor takes the new connection in place of the dead stream (attach)
// and refuses it while the old one still reads. Each side tells its core
// (EvStreamUp), which sends chunks on the stream again.

// Redial pacing: the first attempt after redialFirst, doubling up to
// redialMax between attempts, at most redialAttempts in all; then the
// session runs on its other streams until it ends.
const (
	redialFirst    = 50 * time.Millisecond
	redialMax      = 2 * time.Second
	redialAttempts = 10
)

// startRedial dials stream idx again in the background, on the dialing
// side only.
func (ss *session) startRedial(idx int) {
	if !ss.dialer || ss.ctx.Err() != nil {
		return
	}
	ss.s.wg.Add(1)
	go ss.redial(idx)
}

func (ss *session) redial(idx int) {
	defer ss.s.wg.Done()
	log := ss.s.log.With(zap.String("peer", ss.peerName), zap.String("addr", ss.addr), zap.Int("stream", idx))
	wait := routing.Backoff{First: redialFirst, Max: redialMax}
	var err error
	for attempt := 1; attempt <= redialAttempts; attempt++ {
		t := time.NewTimer(wait.Next())
		select {
		case <-ss.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		var timeout = 2 * time.Second
		if ss.route != nil {
			timeout = ss.route.Conf().ConnectTimeout
		}
		c, derr := handshaker{ss.s}.dialData(ss.ctx, ss, ss.addr, uint16(idx), timeout)
		if derr != nil {
			err = derr
			log.Debug("redial of a data stream failed; retrying", zap.Int("attempt", attempt), zap.Error(err))
			continue
		}
		if !ss.attach(idx, c, nil) {
			if ss.ctx.Err() != nil {
				return
			}
			err = errStreamClosed
			continue
		}
		ss.link.Redials.Add(1)
		ss.s.sender.post(staging.Event{Kind: staging.EvStreamUp, Session: ss.id, Stream: idx, Now: time.Now()})
		log.Info("data stream redialed", zap.Int("attempt", attempt))
		return
	}
	if ss.ctx.Err() == nil {
		log.Warn("gave up redialing a lost data stream; the session goes on with its other streams",
			zap.Int("attempts", redialAttempts), zap.Error(err))
	}
}
