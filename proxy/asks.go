package proxy

import (
	"context"
	"errors"
	"sync"

	"github.com/stage-kv/stage/wire"
)

// Requests to a peer that wait for its answer on the control session,
// matched by sequence number: stagectl's catalog query (CatalogRequest,
// Catalog) and an engine's ticket (Ticket, TicketAnswer). Each kind has
// its table on the session, with a lock of its own (a leaf).

// waiting is the requests of one kind waiting for their answers, by Seq.
type waiting[T any] struct {
	mu sync.Mutex
	m  map[uint64]chan T
}

// add makes seq's answer awaited; the channel gets it.
func (w *waiting[T]) add(seq uint64) chan T {
	ch := make(chan T, 1)
	w.mu.Lock()
	if w.m == nil {
		w.m = map[uint64]chan T{}
	}
	w.m[seq] = ch
	w.mu.Unlock()
	return ch
}

// drop stops waiting for seq's answer.
func (w *waiting[T]) drop(seq uint64) {
	w.mu.Lock()
	delete(w.m, seq)
	w.mu.Unlock()
}

// answer hands v to the request waiting for seq; an answer nobody waits
// for (any more) is dropped. It never blocks (gnet's event loop calls it).
func (w *waiting[T]) answer(seq uint64, v T) {
	w.mu.Lock()
	ch := w.m[seq]
	delete(w.m, seq)
	w.mu.Unlock()
	if ch != nil {
		select {
		case ch <- v:
		default:
		}
	}
}

// errAskGone: the session closed before the peer answered.
var errAskGone = errors.New("session closed")

// ask sends m, whose answer w matches by seq, to ss's peer and waits for
// that answer: errAskGone when the session closed first, ctx's error when
// ctx ended first.
func ask[T any](ctx context.Context, ss *session, w *waiting[T], seq uint64, m wire.Msg) (T, error) {
	ch := w.add(seq)
	defer w.drop(seq)
	ss.send(m)
	var zero T
	select {
	case v := <-ch:
		return v, nil
	case <-ss.done:
		return zero, errAskGone
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}
