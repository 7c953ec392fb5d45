package staging

// Fair shares of a pool of slots among sessions (peers), used for the
// sender core's send slots and for staging.Pool's receive slots.
//
// Each session with demand (work it could start now) is entitled to an
// equal share of the pool. A session under its share may take any free
// slot. A session at or over its share may borrow one only while more
// than the reserve stays free, so that a session that turns up later
// finds slots at once even when one peer has taken all it was lent and
// will not give them back soon (it stopped reading: its slots come back
// only when the stall is detected, staging.stall_timeout). Slots coming
// free go first to sessions under their share (the scheduler serves them
// before any borrower).
//
// The share of a lone session is the pool less the reserve: it cannot
// take the reserve either, or a newcomer would wait for one of its slots.
// The reserve is a sixteenth of the pool (rounded down): enough for a
// newcomer to keep a chunk moving on a couple of streams while the others
// give back their surplus, and little enough that a lone session keeps
// nearly the whole pipeline (30 of 32 slots). A pool of fewer than 16
// slots has none: one slot held back would be too large a part of it.

// Reserve is how many slots of a pool of usable slots a session at or
// over its fair share must leave free.
func Reserve(usable int) int { return max(0, usable/16) }

// FairShare is each of n sessions' entitlement in a pool of usable slots:
// an equal part, and never the reserve.
func FairShare(usable, n int) int {
	if n < 1 {
		n = 1
	}
	return max(1, min(usable/n, usable-Reserve(usable)))
}

// MayTake reports whether a session holding held slots may take one more
// when free are free, given its share and the pool's reserve.
func MayTake(held, free, share, reserve int) bool {
	return free > 0 && (held < share || free > reserve)
}
