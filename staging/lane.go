package staging

import (
	"fmt"
	"sync"

	"github.com/stage-kv/stage/device"
)

// Lane copies small buffers synchronously for the latency path: through
// the device's own synchronous copies when it has them (device.SyncCopier),
// else through one stream and one event of its own, waited for on the
// calling goroutine. Either way the caller gets the bytes when the call
// returns, with no goroutine hand-off. Safe for concurrent use; copies
// through a stream are serialized.
type Lane struct {
	dev  device.Device
	sync device.SyncCopier // nil: use stream and ev

	mu     sync.Mutex
	stream device.Stream
	ev     device.Event
	closed bool
}

// NewLane prepares synchronous copies on dev.
func NewLane(dev device.Device) (*Lane, error) {
	l := &Lane{dev: dev}
	if sc, ok := dev.(device.SyncCopier); ok {
		l.sync = sc
		return l, nil
	}
	s, err := dev.NewStream()
	if err != nil {
		return nil, fmt.Errorf("staging: latency-path stream on %s: %w", dev, err)
	}
	ev, err := dev.NewEvent()
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("staging: latency-path event on %s: %w", dev, err)
	}
	l.stream, l.ev = s, ev
	return l, nil
}

// Gather copies segs into dst and returns once they are there.
func (l *Lane) Gather(dst device.Pinned, segs []device.Seg) error {
	if l.sync != nil {
		return l.sync.GatherSync(dst, segs)
	}
	return l.viaStream(func() error { return l.stream.Gather(dst, segs) })
}

// Scatter copies src into segs and returns once they are there.
func (l *Lane) Scatter(segs []device.Seg, src device.Pinned) error {
	if l.sync != nil {
		return l.sync.ScatterSync(segs, src)
	}
	return l.viaStream(func() error { return l.stream.Scatter(segs, src) })
}

func (l *Lane) viaStream(enqueue func() error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return device.ErrClosed
	}
	if err := enqueue(); err != nil {
		return err
	}
	if err := l.stream.Record(l.ev); err != nil {
		return err
	}
	if err := l.ev.Wait(); err != nil {
		// A failed copy poisons the stream: start over with a new one so
		// the next small transfer is not failed by this one's error.
		if ns, nerr := l.dev.NewStream(); nerr == nil {
			_ = l.stream.Synchronize()
			_ = l.stream.Close()
			l.stream = ns
		}
		return err
	}
	return nil
}

// Close releases the stream and event, if any.
func (l *Lane) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.stream == nil {
		l.closed = true
		return nil
	}
	l.closed = true
	err := l.ev.Close()
	if e := l.stream.Close(); err == nil {
		err = e
	}
	return err
}
