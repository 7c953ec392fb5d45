package vendorkit

import (
	"sync"

	"github.com/stage-kv/stage/device"
)

// Gate is the lock and closed flag of a stream or an event: calls on it
// are serialized (Enter), or shared where the backend allows (EnterShared),
// and refused once it or its device is closed.
type Gate struct {
	mu     sync.RWMutex
	closed bool
}

// Enter locks the gate for op, or fails with c.ErrClosed(op) (then
// unlocked) when the gate or the device c is closed. Leave unlocks.
func (g *Gate) Enter(c *Core, op string) error { return g.enter(g.mu.Lock, g.mu.Unlock, c, op) }

// Leave unlocks what Enter locked.
func (g *Gate) Leave() { g.mu.Unlock() }

// EnterShared is Enter for calls that may run together (a Close waits for
// them); LeaveShared unlocks.
func (g *Gate) EnterShared(c *Core, op string) error { return g.enter(g.mu.RLock, g.mu.RUnlock, c, op) }

// enter takes the gate with lock, or gives it back with unlock and fails
// when the gate or the device is closed.
func (g *Gate) enter(lock, unlock func(), c *Core, op string) error {
	lock()
	if g.closed || c.IsClosed() {
		unlock()
		return c.ErrClosed(op)
	}
	return nil
}

// LeaveShared unlocks what EnterShared locked.
func (g *Gate) LeaveShared() { g.mu.RUnlock() }

// MarkClosed marks the gate closed; the caller is inside Enter.
func (g *Gate) MarkClosed() { g.closed = true }

// IsClosed reports whether the gate was closed; the caller holds the gate
// or whatever else guards MarkClosed.
func (g *Gate) IsClosed() bool { return g.closed }

// Close closes the gate for op ("Event.Close"), runs release (the
// runtime's destroy) and uncounts the object from *count under c.Mu.
func (g *Gate) Close(c *Core, op string, count *int, release func() error) error {
	if err := g.Enter(c, op); err != nil {
		return err
	}
	defer g.Leave()
	g.closed = true
	c.Count(count, -1)
	return release()
}

// Move is a Gather or a Scatter, checked: its segments, its pinned buffer
// and what the segments add up to.
type Move struct {
	Gather   bool          // device to host; else Scatter, host to device
	Op       string        // "Gather" or "Scatter"
	Pinned   device.Pinned // the host side, contiguous
	Segs     []device.Seg  // the device side, in order; may hold empty ones
	Total    uint64        // bytes
	NonEmpty int           // segments of a length other than 0
	Last     int           // the index of the last of them; -1 when none
}

// Move runs a Gather (gather) or Scatter of segs and the pinned buffer p
// on a stream of device c: it checks them (CheckMove), enters the gate
// for it and calls enqueue, the backend's copies, unless there is nothing
// to move. segs may be reused when Move returns.
func (g *Gate) Move(c *Core, gather bool, p device.Pinned, segs []device.Seg, enqueue func(Move) error) error {
	mv, err := CheckMove(c, gather, p, segs)
	if err != nil {
		return err
	}
	if err := g.Enter(c, mv.Op); err != nil {
		return err
	}
	defer g.Leave()
	if mv.Total == 0 {
		return nil
	}
	return enqueue(mv)
}

// OpName names a move in errors: "Gather" or "Scatter".
func OpName(gather bool) string {
	if gather {
		return "Gather"
	}
	return "Scatter"
}

// DirName names a move's direction as the runtimes' copy kinds do: "D2H"
// or "H2D".
func DirName(gather bool) string {
	if gather {
		return "D2H"
	}
	return "H2D"
}

// CheckMove adds up segs for a Gather (gather) or a Scatter on device c,
// refusing a segment whose end or whose running total overflows, and
// segments that do not add up to the pinned buffer p's length.
func CheckMove(c *Core, gather bool, p device.Pinned, segs []device.Seg) (Move, error) {
	m := Move{Gather: gather, Op: OpName(gather), Pinned: p, Segs: segs, Last: -1}
	for i, sg := range segs {
		if sg.Len == 0 {
			continue
		}
		if m.Total+sg.Len < m.Total || uint64(sg.Addr)+sg.Len < uint64(sg.Addr) {
			return Move{}, c.Errorf("%s: segment %d (%#x, %d B) overflows", m.Op, i, uint64(sg.Addr), sg.Len)
		}
		m.Total += sg.Len
		m.NonEmpty++
		m.Last = i
	}
	if m.Total != uint64(p.Len()) {
		return Move{}, c.Errorf("%s: segments add up to %d B, pinned buffer is %d B", m.Op, m.Total, p.Len())
	}
	return m, nil
}
