package staging

import (
	"fmt"
	"sync"

	"github.com/stage-kv/stage/device"
)

// Copier runs copies on one device stream and calls each copy's done
// function, in submission order, once the device has finished it. One
// goroutine per Copier waits on the events.
type Copier struct {
	dev    device.Device
	stream device.Stream
	broken bool       // a copy failed: the stream's error is sticky, replace it
	mu     sync.Mutex // orders enqueue + record so the FIFO matches the stream
	events chan device.Event
	jobs   chan copyJob
	wg     sync.WaitGroup
	closed bool
	quit   chan struct{} // closed by Close: wakes an enqueue waiting for an event
	expand []device.Seg  // runs expanded for a stream without RunCopier (c.mu held)
}

type copyJob struct {
	ev   device.Event
	done func(error)
}

// NewCopier creates a stream and depth events on dev. At most depth copies
// are in flight; Gather and Scatter block while depth are.
func NewCopier(dev device.Device, depth int) (*Copier, error) {
	s, err := dev.NewStream()
	if err != nil {
		return nil, fmt.Errorf("staging: copy stream on %s: %w", dev, err)
	}
	c := &Copier{dev: dev, stream: s, events: make(chan device.Event, depth), jobs: make(chan copyJob, depth), quit: make(chan struct{})}
	for i := 0; i < depth; i++ {
		ev, err := dev.NewEvent()
		if err != nil {
			c.closeEvents()
			_ = s.Close()
			return nil, fmt.Errorf("staging: copy event on %s: %w", dev, err)
		}
		c.events <- ev
	}
	c.wg.Add(1)
	go c.wait()
	return c, nil
}

// Gather enqueues device -> slot; done runs after it completed.
func (c *Copier) Gather(dst device.Pinned, segs []device.Seg, done func(error)) error {
	return c.enqueue(func() error { return c.stream.Gather(dst, segs) }, done)
}

// Scatter enqueues slot -> device; done runs after it completed.
func (c *Copier) Scatter(segs []device.Seg, src device.Pinned, done func(error)) error {
	return c.enqueue(func() error { return c.stream.Scatter(segs, src) }, done)
}

// GatherRuns enqueues device runs -> slot; done runs after it completed.
// A stream without device.RunCopier gets the runs as segments.
func (c *Copier) GatherRuns(dst device.Pinned, runs []device.Run, done func(error)) error {
	return c.enqueue(func() error {
		if rc, ok := c.stream.(device.RunCopier); ok {
			return rc.GatherRuns(dst, runs)
		}
		c.expand = device.AppendRunSegs(c.expand[:0], runs)
		return c.stream.Gather(dst, c.expand)
	}, done)
}

// ScatterRuns enqueues slot -> device runs; done runs after it completed.
func (c *Copier) ScatterRuns(runs []device.Run, src device.Pinned, done func(error)) error {
	return c.enqueue(func() error {
		if rc, ok := c.stream.(device.RunCopier); ok {
			return rc.ScatterRuns(runs, src)
		}
		c.expand = device.AppendRunSegs(c.expand[:0], runs)
		return c.stream.Scatter(c.expand, src)
	}, done)
}

// enqueue refuses with device.ErrClosed once Close began: a caller
// waiting for an event is woken by quit, and one that took an event as
// Close ran closes that event itself (Close released only those it found
// in c.events).
func (c *Copier) enqueue(copyFn func() error, done func(error)) error {
	var ev device.Event
	select {
	case ev = <-c.events: // bounds copies in flight
	case <-c.quit:
		return device.ErrClosed
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		if err := ev.Close(); err != nil {
			return fmt.Errorf("staging: %w; releasing its copy event: %v", device.ErrClosed, err)
		}
		return device.ErrClosed
	}
	if c.broken {
		if err := c.replaceStream(); err != nil {
			c.mu.Unlock()
			c.events <- ev
			return err
		}
	}
	if err := copyFn(); err != nil {
		c.mu.Unlock()
		c.events <- ev
		return err
	}
	if err := c.stream.Record(ev); err != nil {
		c.mu.Unlock()
		c.events <- ev
		return err
	}
	c.jobs <- copyJob{ev: ev, done: done}
	c.mu.Unlock()
	return nil
}

func (c *Copier) wait() {
	defer c.wg.Done()
	for j := range c.jobs {
		err := j.ev.Wait()
		if err != nil {
			c.mu.Lock()
			c.broken = true
			c.mu.Unlock()
		}
		c.events <- j.ev
		j.done(err)
	}
}

// replaceStream swaps a failed stream for a new one (c.mu held). Copies
// already queued on the old one fail with its error; later ones use the
// new stream.
func (c *Copier) replaceStream() error {
	ns, err := c.dev.NewStream()
	if err != nil {
		return fmt.Errorf("staging: replace failed copy stream on %s: %w", c.dev, err)
	}
	old := c.stream
	c.stream, c.broken = ns, false
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		_ = old.Synchronize() // its error is the one already reported
		_ = old.Close()
	}()
	return nil
}

// Close waits for copies in flight (running their done functions) and
// releases the stream and events.
func (c *Copier) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.quit)
	close(c.jobs)
	c.mu.Unlock()
	c.wg.Wait()
	err := c.closeEvents()
	if e := c.stream.Close(); e != nil && err == nil {
		err = e
	}
	return err
}

func (c *Copier) closeEvents() error {
	var err error
	for {
		select {
		case ev := <-c.events:
			if e := ev.Close(); e != nil && err == nil {
				err = e
			}
		default:
			return err
		}
	}
}
