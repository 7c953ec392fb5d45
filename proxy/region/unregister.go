package region

import (
	"sync"
	"time"

	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// goneSignal is closed by the release of a region's last reference, once
// the region let go of its import; err is what closing the import said.
type goneSignal struct {
	once sync.Once
	ch   chan struct{}
	err  error
}

func (g *goneSignal) fire(err error) {
	g.once.Do(func() {
		g.err = err
		close(g.ch)
	})
}

func errClosing(name string) error {
	return status.Errorf(wire.CodeBusy, "region %q: another Unregister is already waiting for its transfers to end; wait for its answer", name)
}

// UnregisterWait removes a region of group and returns only once nothing here uses
// its memory: no transfer holds it, and when it was the last region of its
// allocation, the import is closed. The engine may free the memory then.
// Same-node peers that were handed the region are told to drop it through
// onUnregister, called when the wait begins and again once the region is
// released (for a handle a transfer still running handed out meanwhile);
// their unmapping is not waited for, and a peer told so while the wait
// gives up imports the region again on its next transfer.
//
// While it waits, the region stays in the table, marked: transfers naming
// it are refused, as are another Unregister and a Register of its name.
// When transfers still hold it after wait, or cancel closes first, it is
// put back as it was (usable again) and the error says so: CodeBusy, or
// CodeCancelled. CodeDevice: closing the import failed, and the memory may
// still be mapped.
func (t *Table) UnregisterWait(group, name string, wait time.Duration, cancel <-chan struct{}) error {
	t.mu.Lock()
	r := t.byName[name]
	if err := checkOwn(r, group, name); err != nil {
		t.mu.Unlock()
		return err
	}
	if r.closing {
		t.mu.Unlock()
		return errClosing(name)
	}
	r.closing = true
	t.mu.Unlock()

	g := &goneSignal{ch: make(chan struct{})}
	r.gone.Store(g)
	if t.onUnregister != nil {
		t.onUnregister(r)
	}
	// The registration's reference goes now, so the last transfer's release
	// closes the import; a waiter that gives up takes it back.
	r.Release()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	gaveUp := ""
	select {
	case <-g.ch:
	case <-timer.C:
		gaveUp = "timeout"
	case <-cancel:
		gaveUp = "cancel"
	}
	if gaveUp != "" {
		switch holders, res := t.takeBack(r); res {
		case keptBack:
			if gaveUp == "cancel" {
				return status.Errorf(wire.CodeCancelled, "region %q: the Unregister was given up (the engine's connection closed) while %d transfer(s) still used it; it stays registered", name, holders)
			}
			return status.Errorf(wire.CodeBusy, "region %q: %d transfer(s) still use it after %v; it stays registered and its memory mapped: retry the Unregister once they end (wait for or cancel them)", name, holders, wait)
		case dropped:
			return status.Errorf(wire.CodeShutdown, "region %q: dropped (the sidecar is shutting down, or the connection that registered it closed) while %d transfer(s) still use it; its mapping closes with them", name, holders)
		}
		// released: the last reference went meanwhile; its close is on its way.
	}
	<-g.ch
	t.mu.Lock()
	if t.byName[name] == r {
		delete(t.byName, name)
	}
	t.mu.Unlock()
	if t.onUnregister != nil {
		t.onUnregister(r)
	}
	if g.err != nil {
		return status.Errorf(wire.CodeDevice, "region %q: close the import of its %s allocation: %w; it may still be mapped: do not free the memory", name, r.Handle, g.err)
	}
	return nil
}

// takeBackResult is what became of a region an UnregisterWait gave up on.
type takeBackResult int

const (
	keptBack takeBackResult = iota // registered again, with its registration's reference
	released                       // its last reference went first: the import is being let go
	dropped                        // CloseAll or ReleaseConn took it off the table
)

// takeBack puts a region an UnregisterWait gave up on back in service,
// unless its last reference went meanwhile or the table dropped it. holders
// is how many references transfers held then.
func (t *Table) takeBack(r *Region) (holders int64, res takeBackResult) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byName[r.Name] != r {
		return r.refs.Load(), dropped
	}
	for {
		n := r.refs.Load()
		if n == 0 {
			return 0, released
		}
		if r.refs.CompareAndSwap(n, n+1) {
			r.closing = false
			r.gone.Store(nil)
			return n, keptBack
		}
	}
}
