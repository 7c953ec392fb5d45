// The transfer tables: the engine's transfers by id (xferTable) and the
// transfers whose chunks leave here by core key (outTable). Each has its
// own lock, taken for a map access and never held while calling out, so
// the sender loop's lookup per chunk waits on nothing but other lookups.

package proxy

import (
	"maps"
	"slices"
	"sync"

	"github.com/stage-kv/stage/staging"
)

// maxFinished is how many finished transfers stay queryable by id.
const maxFinished = 4096

// xferTable holds the transfers local engines submitted, by engine id:
// running ones, and the last maxFinished that finished (oldest dropped
// first), so an engine can still ask for a result it came late for.
type xferTable struct {
	mu       sync.Mutex
	byID     map[uint64]*localXfer
	finished []uint64 // finished ids, oldest first (bounded history)
}

func newXferTable() xferTable { return xferTable{byID: map[uint64]*localXfer{}} }

func (t *xferTable) add(lx *localXfer) {
	t.mu.Lock()
	t.byID[lx.id] = lx
	t.mu.Unlock()
}

// get is the transfer id names, nil when unknown or forgotten.
func (t *xferTable) get(id uint64) *localXfer {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byID[id]
}

// finish records that id finished: it stays queryable until maxFinished
// transfers finished after it.
func (t *xferTable) finish(id uint64) {
	t.mu.Lock()
	t.finished = append(t.finished, id)
	if len(t.finished) > maxFinished {
		delete(t.byID, t.finished[0])
		t.finished = t.finished[1:]
	}
	t.mu.Unlock()
}

// all is a snapshot of every transfer held, finished or not.
func (t *xferTable) all() []*localXfer {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Collect(maps.Values(t.byID))
}

// running counts the unfinished transfers on ss (any session when ss is
// nil).
func (t *xferTable) running(ss *session) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, lx := range t.byID {
		if ss != nil && lx.ss != ss {
			continue
		}
		select {
		case <-lx.done:
		default:
			n++
		}
	}
	return n
}

// outTable holds the transfers whose chunks leave here (our pushes and
// the pulls we serve) by the sender core's key, from admission until the
// core retires them.
type outTable struct {
	mu    sync.Mutex
	byKey map[staging.Key]*outXfer
}

func newOutTable() outTable { return outTable{byKey: map[staging.Key]*outXfer{}} }

func (t *outTable) put(ox *outXfer) {
	t.mu.Lock()
	t.byKey[ox.key] = ox
	t.mu.Unlock()
}

// get is the transfer of key, nil when there is none (retired).
func (t *outTable) get(key staging.Key) *outXfer {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byKey[key]
}

// take removes and returns the transfer of key (nil when there is none).
func (t *outTable) take(key staging.Key) *outXfer {
	t.mu.Lock()
	defer t.mu.Unlock()
	ox := t.byKey[key]
	delete(t.byKey, key)
	return ox
}

// takeAll empties the table and returns what it held.
func (t *outTable) takeAll() map[staging.Key]*outXfer {
	t.mu.Lock()
	defer t.mu.Unlock()
	all := t.byKey
	t.byKey = map[staging.Key]*outXfer{}
	return all
}

func (t *outTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey)
}

// served counts the pulls ss's peer has us serve (our pushes are the
// engine's transfers, counted by xferTable).
func (t *outTable) served(ss *session) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, ox := range t.byKey {
		if _, served := ox.end.(servedPull); served && ox.ss == ss {
			n++
		}
	}
	return n
}

// progress moves XferStatus.Done of our pushes as their acks arrive.
func (t *outTable) progress(ps []staging.Progress) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range ps {
		if ox := t.byKey[p.Transfer]; ox != nil {
			ox.end.progress(p.Bytes)
		}
	}
}
