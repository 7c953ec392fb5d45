package proxy

import (
	"sync"
	"time"
)

// streamSet is a session's data streams by index, under a lock of its
// own: attached, replaced after a loss (attach, redial.go), chosen for a
// chunk (the sender loop) or a small push (quiet), watched (stall.go) and
// stopped with the session.
//
// Lock order: streamSet.mu is a leaf, like the session's other locks.
type streamSet struct {
	mu       sync.Mutex
	list     []*dataStream // by index; nil: not attached (yet)
	stripes  int           // the streams the session runs (the accepting side's grows as they attach)
	attached int
	closed   bool // the session closed: nothing attaches any more
}

// get is stream i, nil when the session closed or i is out of range.
func (t *streamSet) get(i int) *dataStream {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || i >= len(t.list) {
		return nil
	}
	return t.list[i]
}

// snapshot appends the streams (nil where none is attached) to buf.
func (t *streamSet) snapshot(buf []*dataStream) []*dataStream {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append(buf, t.list...)
}

// count is the number of data streams the session runs.
func (t *streamSet) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stripes
}

// load is what the session counts against limits.max_streams: a dialed
// session's stripes, an accepted one's streams attached so far.
func (t *streamSet) load(dialer bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if dialer {
		return len(t.list)
	}
	return t.stripes
}

// up is the number of streams attached and still reading.
func (t *streamSet) up() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, ds := range t.list {
		if ds != nil && !ds.readerDone.Load() {
			n++
		}
	}
	return n
}

// left reports whether any attached stream still reads.
func (t *streamSet) left() bool { return t.up() > 0 }

// quiet picks the live stream with the least queued for writing, so a
// small push does not wait behind a large chunk.
func (t *streamSet) quiet() *dataStream {
	t.mu.Lock()
	defer t.mu.Unlock()
	var best *dataStream
	for _, ds := range t.list {
		if ds == nil || ds.dead.Load() {
			continue
		}
		if best == nil || ds.queued.Load() < best.queued.Load() {
			best = ds
		}
	}
	return best
}

// claim is the first step of attaching stream i: the stream it replaces
// (nil for none), or false when i is taken by a stream still reading or
// the session closed.
func (t *streamSet) claim(i int) (old *dataStream, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old = t.list[i]
	return old, !t.closed && (old == nil || old.readerDone.Load())
}

// put installs ds as stream i in place of old, unless the session closed
// or another stream took i meanwhile; grow: an accepting session's
// stripes count up to i+1.
func (t *streamSet) put(i int, old, ds *dataStream, grow bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.list[i] != old {
		return false
	}
	t.list[i] = ds
	t.attached++
	if grow && i >= t.stripes {
		t.stripes = i + 1
	}
	return true
}

// stop stops every stream and lets none attach any more.
func (t *streamSet) stop() {
	t.mu.Lock()
	t.closed = true
	streams := append([]*dataStream(nil), t.list...)
	t.mu.Unlock()
	for _, ds := range streams {
		if ds != nil {
			ds.stop()
		}
	}
}

// stuckWrite is how long a writev must have been blocked, when a transfer
// on its session misses its progress deadline, for its stream to count
// as stuck (see unstick).
const stuckWrite = time.Second

// unstick shuts down the session's data streams whose writer has been
// blocked in one writev for more than stuckWrite, and returns how many.
// It runs when a transfer on the session missed its progress deadline: a
// peer that stopped reading would otherwise keep the send slots of the
// chunks blocked in, and queued behind, those writes after the transfer
// failed, starving every other route. Their writes fail, so the slots
// come back (the core resends other transfers' chunks on a live stream);
// a session left with no stream closes, and its route redials.
func (t *streamSet) unstick(now time.Time) int {
	n := 0
	for _, ds := range t.snapshot(nil) {
		if ds == nil {
			continue
		}
		if since := ds.writing.Load(); since != 0 && now.Sub(time.Unix(0, since)) > stuckWrite {
			ds.rc.Shutdown()
			n++
		}
	}
	return n
}
