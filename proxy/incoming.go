package proxy

import "time"

// Finding the incoming transfer a chunk belongs to, and remembering the
// ones that ended (so that their late chunks are drained, or recognised
// as second copies, at once).

// maxGone bounds the tombstones of finished incoming transfers kept per session.
const maxGone = 4096

// maxGoneBitWords bounds, per session, the landed bitmaps kept for failed
// transfers (1 MiB of words): enough for the few transfers that fail at
// once, while a peer that fails transfers of millions of chunks cannot
// make us hold more.
const maxGoneBitWords = 1 << 17

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
		old := ss.goneRing[0]
		delete(ss.gone, old)
		ss.bitWords -= len(ss.goneBits[old])
		delete(ss.goneBits, old)
		ss.goneRing = ss.goneRing[1:]
	}
	ss.announce.Broadcast()
}

// keepBitsLocked remembers which chunks of a failed transfer had landed,
// so that a second copy of one of them, arriving after the transfer was
// forgotten, is still answered with nothing: its first copy's Ack
// returned the credit, and a Credit would give the sender one too many
// (PROTOCOL 8.7). Past the budget the bitmap is not kept, and such a late
// second copy returns a credit as before.
func (ss *session) keepBitsLocked(wireID uint64, bits []uint64) {
	if len(bits) == 0 || ss.bitWords+len(bits) > maxGoneBitWords {
		return
	}
	if _, ok := ss.goneBits[wireID]; ok {
		return
	}
	if ss.goneBits == nil {
		ss.goneBits = map[uint64][]uint64{}
	}
	ss.goneBits[wireID] = bits
	ss.bitWords += len(bits)
}

// landedGoneLocked reports whether chunk idx of a forgotten transfer had
// landed: every chunk of a complete one, those in the bitmap of a failed one.
func (ss *session) landedGoneLocked(wireID uint64, idx uint32) bool {
	if ss.gone[wireID] {
		return true
	}
	bits := ss.goneBits[wireID]
	return int(idx/64) < len(bits) && bits[idx/64]&(uint64(1)<<(idx%64)) != 0
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
