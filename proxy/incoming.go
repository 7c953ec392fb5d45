package proxy

import "time"

// Finding the incoming transfer a chunk belongs to, and remembering the
// ones that ended (so that their late chunks are drained, or recognised
// as second copies, at once).

// maxGone bounds the tombstones of finished incoming transfers kept per session.
const maxGone = 4096

// buryLocked records that an incoming transfer finished or was refused, so
// its late chunks are drained at once instead of waited for (ss.mu held).
// complete says every chunk landed: a late chunk of it is a second copy.
func (ss *session) buryLocked(wireID uint64, complete bool) {
	if _, ok := ss.gone[wireID]; ok {
		return
	}
	ss.gone[wireID] = complete
	ss.goneRing = append(ss.goneRing, wireID)
	if len(ss.goneRing) > maxGone {
		delete(ss.gone, ss.goneRing[0])
		ss.goneRing = ss.goneRing[1:]
	}
	ss.announce.Broadcast()
}

// announceWait is how long a chunk that arrived ahead of its transfer's
// Announce waits for it. The sender starts sending right after it queued
// the Announce, on another connection, so the two may cross.
const announceWait = time.Second

// incoming finds the transfer a chunk belongs to, waiting briefly for an
// Announce that has not arrived yet; nil for a finished, refused or
// unknown transfer.
func (ss *session) incoming(wireID uint64) *inXfer {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if x := ss.in[wireID]; x != nil {
		return x
	}
	if ss.ours(wireID) {
		return nil // our pull: created before the request went out
	}
	deadline := time.Now().Add(announceWait)
	timer := time.AfterFunc(announceWait, func() {
		ss.mu.Lock()
		ss.announce.Broadcast()
		ss.mu.Unlock()
	})
	defer timer.Stop()
	for {
		if x := ss.in[wireID]; x != nil {
			return x
		}
		if _, dead := ss.gone[wireID]; dead || ss.closed || !time.Now().Before(deadline) {
			return nil
		}
		ss.announce.Wait()
	}
}
