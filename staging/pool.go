package staging

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/stage-kv/stage/device"
)

// Pool is a fixed set of equally sized pinned slots cut from one slab.
type Pool struct {
	dev      device.Device
	slab     device.Pinned
	slotSize int
	slots    []device.Pinned
	renewer  device.SlotRenewer // set: slots from AllocSlots, renewable
	inUse    atomic.Int64

	// Free slots are handed out last in, first out: the slot released last
	// is the one most likely still in the CPU caches, so the next recv into
	// it and the copy out of it skip DRAM. A FIFO would walk the whole pool
	// (128 MiB and more, several times the last-level cache) and every
	// chunk would land in cold memory. tokens holds one value per free slot
	// (it is what Acquire waits on); stack holds their indexes. Release
	// pushes before it adds the token and Acquire pops after it takes one,
	// so the stack is never short.
	tokens chan struct{}
	mu     sync.Mutex
	stack  []int

	// Fair shares among tenants (AcquireAs, fair.go), on fmu.
	fmu      sync.Mutex
	active   int           // tenants holding or waiting for a slot
	sleepers int           // AcquireAs calls waiting on wake
	wake     chan struct{} // closed when a tenant's slot comes back and someone sleeps
}

// Tenant is one user of a Pool's fair shares: a peer session's data
// stream readers. Its zero value is ready; it belongs to one pool.
type Tenant struct {
	held    int // on the pool's fmu
	waiting int
}

// NewPool allocates slots*slotSize bytes of pinned memory on dev.
func NewPool(dev device.Device, slotSize, slots int) (*Pool, error) {
	if slotSize <= 0 || slots <= 0 {
		return nil, fmt.Errorf("staging: pool of %d slots of %d B: both must be positive", slots, slotSize)
	}
	slab, err := dev.AllocPinned(slotSize * slots)
	if err != nil {
		return nil, fmt.Errorf("staging: pinned pool of %d x %d B on %s: %w; lower staging.slots or staging.slot_size", slots, slotSize, dev, err)
	}
	p := &Pool{dev: dev, slab: slab, slotSize: slotSize}
	for i := 0; i < slots; i++ {
		p.slots = append(p.slots, slab.Slice(i*slotSize, slotSize))
	}
	p.fill()
	return p, nil
}

// NewRenewablePool is NewPool with slots that can be given fresh pages
// (Renew), for splice send: dev must implement device.SlotRenewer.
func NewRenewablePool(dev device.Device, slotSize, slots int) (*Pool, error) {
	r, ok := dev.(device.SlotRenewer)
	if !ok {
		return nil, fmt.Errorf("staging: %s cannot renew slot pages (no device.SlotRenewer)", dev)
	}
	if slotSize <= 0 || slots <= 0 {
		return nil, fmt.Errorf("staging: pool of %d slots of %d B: both must be positive", slots, slotSize)
	}
	ps, err := r.AllocSlots(slotSize, slots)
	if err != nil {
		return nil, fmt.Errorf("staging: renewable pinned pool of %d x %d B on %s: %w; lower staging.slots or staging.slot_size", slots, slotSize, dev, err)
	}
	p := &Pool{dev: dev, slotSize: slotSize, slots: ps, renewer: r}
	p.fill()
	return p, nil
}

// fill makes every slot free, slot 0 on top.
func (p *Pool) fill() {
	n := len(p.slots)
	p.tokens = make(chan struct{}, n)
	p.stack = make([]int, 0, n)
	for i := n - 1; i >= 0; i-- {
		p.stack = append(p.stack, i)
		p.tokens <- struct{}{}
	}
}

// Renew gives slot i fresh pages at the same host address (see
// Sender's Ready.Taint); the caller holds the slot and nothing copies into
// or out of it meanwhile. Slot(i) reads the new views afterwards, which is
// safe for other goroutines once they learned of the renewal through a
// channel or lock (the proxy's mailbox).
func (p *Pool) Renew(i int) error {
	if p.renewer == nil {
		return fmt.Errorf("staging: renew slot %d: the pool's slots are not renewable", i)
	}
	s, err := p.renewer.RenewSlot(p.slots[i])
	if err != nil {
		return fmt.Errorf("staging: renew send slot %d: %w", i, err)
	}
	p.slots[i] = s
	return nil
}

// Renewable reports whether Renew works on this pool.
func (p *Pool) Renewable() bool { return p.renewer != nil }

// SlotSize is the size of every slot.
func (p *Pool) SlotSize() int { return p.slotSize }

// Cap is the number of slots.
func (p *Pool) Cap() int { return len(p.slots) }

// InUse is the number of slots acquired and not yet released.
func (p *Pool) InUse() int { return int(p.inUse.Load()) }

// Slot returns slot i's buffer.
func (p *Pool) Slot(i int) device.Pinned { return p.slots[i] }

// Acquire takes a free slot, waiting until one is released or ctx is done.
func (p *Pool) Acquire(ctx context.Context) (int, error) {
	select {
	case <-p.tokens:
		return p.pop(), nil
	default:
	}
	select {
	case <-p.tokens:
		return p.pop(), nil
	case <-ctx.Done():
		return -1, ctx.Err()
	}
}

// TryAcquire takes a free slot if there is one.
func (p *Pool) TryAcquire() (int, bool) {
	select {
	case <-p.tokens:
		return p.pop(), true
	default:
		return -1, false
	}
}

// pop takes the most recently released slot; the caller holds a token.
func (p *Pool) pop() int {
	p.inUse.Add(1)
	p.mu.Lock()
	i := p.stack[len(p.stack)-1]
	p.stack = p.stack[:len(p.stack)-1]
	p.mu.Unlock()
	return i
}

// Release returns slot i.
func (p *Pool) Release(i int) {
	p.inUse.Add(-1)
	p.mu.Lock()
	p.stack = append(p.stack, i)
	p.mu.Unlock()
	p.tokens <- struct{}{}
}

// AcquireAs is Acquire for tenant t, within its fair share (fair.go): a
// tenant at or over its share among the tenants holding or waiting for
// slots takes one only while more than the reserve stays free; otherwise
// it waits until a slot comes back (ReleaseAs) and checks again.
func (p *Pool) AcquireAs(ctx context.Context, t *Tenant) (int, error) {
	p.fmu.Lock()
	if t.held == 0 && t.waiting == 0 {
		p.active++
	}
	t.waiting++
	for {
		n := len(p.slots)
		if MayTake(t.held, len(p.tokens), FairShare(n, p.active), Reserve(n)) {
			select {
			case <-p.tokens:
				t.waiting--
				t.held++
				p.fmu.Unlock()
				return p.pop(), nil
			default:
			}
		}
		if p.wake == nil {
			p.wake = make(chan struct{})
		}
		w := p.wake
		p.sleepers++
		p.fmu.Unlock()
		var err error
		select {
		case <-w:
		case <-ctx.Done():
			err = ctx.Err()
		}
		p.fmu.Lock()
		p.sleepers--
		if err != nil {
			t.waiting--
			if t.held == 0 && t.waiting == 0 {
				p.active--
				p.wakeLocked() // the others' shares grew
			}
			p.fmu.Unlock()
			return -1, err
		}
	}
}

// ReleaseAs returns slot i, taken by AcquireAs for t, and wakes the
// tenants waiting for one. It allocates only when someone waits.
func (p *Pool) ReleaseAs(i int, t *Tenant) {
	p.Release(i)
	p.fmu.Lock()
	t.held--
	if t.held == 0 && t.waiting == 0 {
		p.active--
	}
	p.wakeLocked()
	p.fmu.Unlock()
}

// wakeLocked wakes every AcquireAs waiting, to check again (fmu held).
func (p *Pool) wakeLocked() {
	if p.sleepers > 0 && p.wake != nil {
		close(p.wake)
		p.wake = nil
	}
}

// Close frees the slab. It fails, freeing nothing, while slots are in use.
func (p *Pool) Close() error {
	if n := p.InUse(); n != 0 {
		return fmt.Errorf("staging: closing pool with %d of %d slots still in use", n, len(p.slots))
	}
	if p.renewer != nil {
		return p.renewer.FreeSlots(p.slots)
	}
	return p.dev.FreePinned(p.slab)
}
