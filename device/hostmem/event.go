package hostmem

import (
	"fmt"
	"sync"

	"github.com/stage-kv/stage/device"
)

// event is a marker in a stream. Each Record starts a new generation; the
// event is complete when the generation last recorded has been reached by
// its stream's worker. An event never recorded counts as complete (as a
// CUDA event does).
type event struct {
	d *Dev

	mu      sync.Mutex
	cond    sync.Cond // broadcast on completion
	gen     uint64    // generations recorded
	doneGen uint64    // last generation completed
	err     error     // the error doneGen completed with
	closed  bool
}

var _ device.Event = (*event)(nil)

func newEvent(d *Dev) *event {
	e := &event{d: d}
	e.cond.L = &e.mu
	return e
}

// arm starts a new generation for Record.
func (e *event) arm() (uint64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.closed:
		return 0, fmt.Errorf("event %w", device.ErrClosed)
	case e.doneGen != e.gen:
		return 0, fmt.Errorf("event is still pending; wait for it before recording it again: %w", device.ErrNotReady)
	}
	e.gen++
	return e.gen, nil
}

// complete is called by the worker when it reaches generation gen.
func (e *event) complete(gen uint64, err error) {
	e.mu.Lock()
	if gen > e.doneGen {
		e.doneGen = gen
		e.err = err
	}
	e.mu.Unlock()
	e.cond.Broadcast()
}

// Query reports, without blocking, whether the last recording completed and
// with which error.
func (e *event) Query() (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false, fmt.Errorf("%s: query: event %w", e.d.name, device.ErrClosed)
	}
	if e.doneGen != e.gen {
		return false, nil
	}
	return true, e.err
}

// Wait blocks until the recording current when it was called completes and
// returns that work's error.
func (e *event) Wait() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("%s: wait: event %w", e.d.name, device.ErrClosed)
	}
	g := e.gen
	for e.doneGen < g {
		e.cond.Wait()
	}
	return e.err
}

// Close releases the event. A pending recording still completes (nobody can
// see it); a second Close returns an error wrapping device.ErrClosed.
func (e *event) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return fmt.Errorf("%s: close: event %w", e.d.name, device.ErrClosed)
	}
	e.closed = true
	e.mu.Unlock()
	e.d.mu.Lock()
	delete(e.d.events, e)
	e.d.mu.Unlock()
	return nil
}
