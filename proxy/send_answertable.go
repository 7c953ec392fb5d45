package proxy

import (
	"sync"

	"github.com/stage-kv/stage/staging"
)

// answerTable is a session's sending half as its peer's answers see it:
// the transfers an Ack, Nack or Resend may name, by wire id, each typed by
// its kind (send_answers.go), and the core keys of the pulls we served
// that retired. It has a lock of its own and no I/O.
//
// Lock order: answerTable.mu is a leaf. Nothing else is locked while it
// is held, and no caller holds session.mu or the inbound half's lock
// when it takes it. Whether the session closed, when a small push or a
// served pull is to be listed, the table answers itself: close stops it
// listing those.
type answerTable struct {
	mu      sync.Mutex
	byID    map[uint64]answerer
	retired map[uint64]staging.Key // pulls we served that retired: their late Acks still reach the core
	retRing []uint64               // their wire ids, oldest first (bounded by maxRetired)
	closed  bool                   // the session closed: no small push or served pull is listed any more
}

// maxRetired bounds the retired served pulls a session remembers; the
// core keeps as many tombs (staging's maxTombs).
const maxRetired = 1024

func newAnswerTable() *answerTable {
	return &answerTable{byID: map[uint64]answerer{}, retired: map[uint64]staging.Key{}}
}

// lookup is what the table lists for id: its entry, else, for an id the
// peer allocated (peers), the core key of a served pull that retired;
// nil when neither.
func (t *answerTable) lookup(id uint64, peers bool) answerer {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a := t.byID[id]; a != nil {
		return a
	}
	if k, ok := t.retired[id]; ok && peers {
		return coreServed(k)
	}
	return nil
}

// expect lists id as a.
func (t *answerTable) expect(id uint64, a answerer) {
	t.mu.Lock()
	t.byID[id] = a
	t.mu.Unlock()
}

// expectInline lists our small push ix as id, unless the session closed.
func (t *answerTable) expectInline(id uint64, ix *inlineXfer) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.byID[id] = ix
	return true
}

// serve lists a pull we serve as id with core key key, unless a pull we
// serve holds id already (dup) or the session closed.
func (t *answerTable) serve(id uint64, key staging.Key) (dup, closed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, dup = t.byID[id].(coreServed)
	if !dup && !t.closed {
		t.byID[id] = coreServed(key)
	}
	return dup, t.closed
}

// forget takes id out of the table if it is still listed as a.
func (t *answerTable) forget(id uint64, a answerer) {
	t.mu.Lock()
	if t.byID[id] == a {
		delete(t.byID, id)
	}
	t.mu.Unlock()
}

// retire takes a served pull out of the table and remembers its core key,
// so that an Ack arriving after it retired still reaches the core, which
// returns the credits of copies it owed. The last maxRetired are kept.
func (t *answerTable) retire(id uint64, key staging.Key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.byID[id].(coreServed); ok {
		delete(t.byID, id)
	}
	if _, ok := t.retired[id]; ok {
		return
	}
	t.retired[id] = key
	t.retRing = append(t.retRing, id)
	if len(t.retRing) > maxRetired {
		delete(t.retired, t.retRing[0])
		t.retRing = t.retRing[1:]
	}
}

// takeInline removes and returns our small push listed as id, if any.
func (t *answerTable) takeInline(id uint64) *inlineXfer {
	t.mu.Lock()
	defer t.mu.Unlock()
	ix, _ := t.byID[id].(*inlineXfer)
	if ix != nil {
		delete(t.byID, id)
	}
	return ix
}

// takeInlines removes and returns our small pushes for which keep says
// false (all of them when keep is nil).
func (t *answerTable) takeInlines(keep func(*inlineXfer) bool) []*inlineXfer {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*inlineXfer
	for id, a := range t.byID {
		if ix, ok := a.(*inlineXfer); ok && (keep == nil || !keep(ix)) {
			out = append(out, ix)
			delete(t.byID, id)
		}
	}
	return out
}

// inlines counts our small pushes listed.
func (t *answerTable) inlines() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, a := range t.byID {
		if _, ok := a.(*inlineXfer); ok {
			n++
		}
	}
	return n
}

// close stops the table listing small pushes and served pulls: the
// session closed. What it lists stays until taken or forgotten.
func (t *answerTable) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
}
