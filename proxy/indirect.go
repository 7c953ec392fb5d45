package proxy

import (
	"time"

	"github.com/stage-kv/stage/wire"
)

// Same-node additions to incoming transfers.

// touch records progress (a direct copy is under way).
func (x *inXfer) touch() {
	x.mu.Lock()
	x.progress = time.Now()
	x.mu.Unlock()
}

// directLanded completes a transfer whose n bytes the peer (push) or we
// (pull) copied directly: no chunks, no acks.
func (x *inXfer) directLanded(n uint64) error {
	x.mu.Lock()
	if x.finished {
		x.mu.Unlock()
		return errFinished
	}
	if n != x.total {
		x.mu.Unlock()
		return codeErr(wire.CodeMalformed, "direct copy of %d B, the transfer has %d B", n, x.total)
	}
	x.finished, x.bytes, x.progress = true, n, time.Now()
	x.mu.Unlock()
	x.done(nil)
	return nil
}

// viaRing marks a transfer whose chunks arrive through the shared ring:
// they are answered on the node connection, not with Ack or Credit.
func (x *inXfer) viaRing() {
	x.mu.Lock()
	x.ring = true
	x.mu.Unlock()
}

// checkNack returns the error of a Nack (or a cancel) that arrived for a
// direct transfer, nil when none did.
func (n *nodeState) checkNack(id uint64) error {
	n.mu.Lock()
	ch := n.nacks[id]
	n.mu.Unlock()
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

// watchNacks registers a direct transfer for nack; unwatch forgets it.
func (n *nodeState) watchNacks(id uint64) {
	n.mu.Lock()
	n.nacks[id] = make(chan error, 1)
	n.mu.Unlock()
}

func (n *nodeState) unwatch(id uint64) {
	n.mu.Lock()
	delete(n.nacks, id)
	n.mu.Unlock()
}

// nack hands err to a direct transfer watching id; false if none is.
func (n *nodeState) nack(id uint64, err error) bool {
	n.mu.Lock()
	ch := n.nacks[id]
	n.mu.Unlock()
	if ch == nil {
		return false
	}
	select {
	case ch <- err:
	default:
	}
	return true
}

// waitNack waits up to d for a Nack of id (a refusal explains itself better
// there than in the node socket's answer).
func (n *nodeState) waitNack(id uint64, d time.Duration) error {
	n.mu.Lock()
	ch := n.nacks[id]
	n.mu.Unlock()
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
