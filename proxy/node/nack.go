package node

import (
	"time"
)

// The verdicts of direct pushes: a push on a same-node path learns of a
// Nack (or a cancel) that arrives on the control session through these.

// CheckNack returns the error of a Nack (or a cancel) that arrived for a
// direct transfer, nil when none did.
func (p *Peer) CheckNack(id uint64) error {
	p.mu.Lock()
	ch := p.nacks[id]
	p.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case err := <-ch:
		return err
	default:
		return nil
	}
}

// WatchNacks registers a direct transfer for Nack; Unwatch forgets it.
func (p *Peer) WatchNacks(id uint64) {
	p.mu.Lock()
	p.nacks[id] = make(chan error, 1)
	p.mu.Unlock()
}

func (p *Peer) Unwatch(id uint64) {
	p.mu.Lock()
	delete(p.nacks, id)
	p.mu.Unlock()
}

// Nack hands err to a direct transfer watching id; false if none is.
func (p *Peer) Nack(id uint64, err error) bool {
	p.mu.Lock()
	ch := p.nacks[id]
	p.mu.Unlock()
	if ch == nil {
		return false
	}
	select {
	case ch <- err:
	default:
	}
	return true
}

// WaitNack waits up to d for a Nack of id (a refusal explains itself
// better there than in the node socket's answer).
func (p *Peer) WaitNack(id uint64, d time.Duration) error {
	p.mu.Lock()
	ch := p.nacks[id]
	p.mu.Unlock()
	if ch == nil {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-ch:
		return err
	case <-t.C:
		return nil
	}
}
