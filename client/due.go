package client

import (
	"sync"
	"time"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/wire"
)

// The answers the reader can foresee. A Do of a large transfer waits far
// longer than the reader's polling window, so the reader sleeps and the
// answer waits for its thread to be woken (50-150 us on an idle machine,
// docs/BENCHMARKS.md, the ipc row). The client keeps the pace of the last
// Do that ended well on each route and peer; a Do of n bytes is then due
// about n times that pace after it was sent, and the reader waits for it
// as a message due (spin.Due): asleep in the kernel until a little before,
// then polling through it. Only where the client polls at all (WithSpin).

// maxPaces bounds the routes and peers whose pace is kept; past it the
// book starts over.
const maxPaces = 256

// dueBook is what a client expects of its Do calls in flight.
type dueBook struct {
	mu   sync.Mutex
	pace map[string]spin.Pace // of the last Do that ended well, by route and peer
	open map[uint64]spin.Due
}

// paceKey is the pace's key of t: its route and peer.
func paceKey(t *Transfer) string { return t.Route + "\x00" + t.Peer }

// opsBytes is the bytes t moves.
func opsBytes(t *Transfer) uint64 {
	var n uint64
	for _, op := range t.Ops {
		n += op.Len
	}
	return n
}

// expect records that request req, a Do of n bytes on key, goes out at
// now: due by key's pace, if one is known (then it reports true).
func (b *dueBook) expect(req uint64, key string, n uint64, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.pace[key].Due(now, n)
	if d == (spin.Due{}) {
		return false
	}
	if b.open == nil {
		b.open = map[uint64]spin.Due{}
	}
	b.open[req] = d
	return true
}

// settle ends request req's wait and, when it moved its n bytes (ok),
// learns key's pace from it: sent at start, answered at now.
func (b *dueBook) settle(req uint64, key string, n uint64, start, now time.Time, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.open, req)
	p := spin.PaceOf(now.Sub(start), n)
	if !ok || p == 0 {
		return
	}
	if b.pace == nil || len(b.pace) >= maxPaces {
		b.pace = map[string]spin.Pace{}
	}
	b.pace[key] = p
}

// answered drops request req's wait: its answer came (the reader, before
// its caller settles it), so the reader does not poll for it again.
func (b *dueBook) answered(req uint64) {
	b.mu.Lock()
	delete(b.open, req)
	b.mu.Unlock()
}

// next is the earliest answer due among those in flight (zero: none).
func (b *dueBook) next() spin.Due {
	b.mu.Lock()
	defer b.mu.Unlock()
	var first spin.Due
	for _, d := range b.open {
		if first.Start.IsZero() || d.Start.Add(d.Expect).Before(first.Start.Add(first.Expect)) {
			first = d
		}
	}
	return first
}

// moved reports whether a's answer to a Do says the transfer completed.
func moved(a wire.Msg) bool {
	s, ok := a.(*wire.XferStatus)
	return ok && s.State == wire.StateDone
}
