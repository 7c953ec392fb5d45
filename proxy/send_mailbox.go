package proxy

import (
	"sync"

	"github.com/stage-kv/stage/staging"
)

// mailbox queues events for the sender loop without ever blocking the
// poster (gnet handlers and copy callbacks must not block). Its length is
// bounded by the chunks in flight, which the slot pools bound.
type mailbox struct {
	mu     sync.Mutex
	q      []staging.Event
	spare  []staging.Event
	signal chan struct{}
}

func newMailbox() *mailbox { return &mailbox{signal: make(chan struct{}, 1)} }

func (m *mailbox) post(ev staging.Event) {
	m.mu.Lock()
	m.q = append(m.q, ev)
	m.mu.Unlock()
	select {
	case m.signal <- struct{}{}:
	default:
	}
}

// take returns every queued event; the slice is valid until the next take.
func (m *mailbox) take() []staging.Event {
	m.mu.Lock()
	q := m.q
	m.q = m.spare[:0]
	m.spare = q
	m.mu.Unlock()
	return q
}
