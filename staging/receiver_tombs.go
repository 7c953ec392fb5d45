package staging

// Tombstones of incoming transfers (PROTOCOL 8.7): which ones finished
// or were refused, so that their late chunks are drained at once instead
// of waited for, and which of their chunks had landed, so that a late
// second copy is answered with nothing.

// maxGone bounds the tombstones kept per session.
const maxGone = 4096

// maxGoneBitWords bounds, per session, the landed bitmaps kept for failed
// transfers (1 MiB of words): enough for the few transfers that fail at
// once, while a peer that fails transfers of millions of chunks cannot
// make us hold more.
const maxGoneBitWords = 1 << 17

type tombstones struct {
	max, maxWords int
	complete      map[uint64]bool // true: every chunk landed
	ring          []uint64        // ids, oldest first
	bits          map[uint64][]uint64
	words         int // held in bits
}

func newTombstones(max, maxWords int) tombstones {
	return tombstones{max: max, maxWords: maxWords, complete: map[uint64]bool{}, bits: map[uint64][]uint64{}}
}

func (t *tombstones) has(id uint64) bool {
	_, ok := t.complete[id]
	return ok
}

// bury remembers id once; past max, the oldest goes, bitmap and all.
func (t *tombstones) bury(id uint64, complete bool) {
	if t.has(id) {
		return
	}
	t.complete[id] = complete
	t.ring = append(t.ring, id)
	if len(t.ring) > t.max {
		old := t.ring[0]
		delete(t.complete, old)
		t.words -= len(t.bits[old])
		delete(t.bits, old)
		t.ring = t.ring[1:]
	}
}

// keepBits remembers which chunks of failed transfer id had landed: its
// first copies' Acks returned their credits, and a Credit for a late
// second copy would give the sender one too many. Past the budget the
// bitmap is not kept, and such a late second copy returns a credit.
func (t *tombstones) keepBits(id uint64, bits []uint64) {
	if len(bits) == 0 || t.words+len(bits) > t.maxWords || !t.has(id) {
		return
	}
	if _, ok := t.bits[id]; ok {
		return
	}
	t.bits[id] = bits
	t.words += len(bits)
}

// landed reports whether chunk idx of forgotten transfer id had landed:
// every chunk of a complete one, those in the bitmap of a failed one.
func (t *tombstones) landed(id uint64, idx uint32) bool {
	if t.complete[id] {
		return true
	}
	bits := t.bits[id]
	return int(idx/64) < len(bits) && bits[idx/64]&(uint64(1)<<(idx%64)) != 0
}
