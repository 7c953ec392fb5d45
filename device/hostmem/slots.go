package hostmem

import (
	"fmt"
	"math"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/internal/pagemap"
)

var _ device.SlotRenewer = (*Dev)(nil)

// AllocSlots maps one anonymous private slab of n slots of size bytes,
// prefaulted like AllocPinned. Anonymous rather than a memfd: a renewed
// slot gets fresh pages of its own, which a shared file mapping would
// not give (the file's pages stay the file's). It counts as one pinned
// buffer until FreeSlots.
func (d *Dev) AllocSlots(size, n int) ([]device.Pinned, error) {
	if size <= 0 || n <= 0 || size > math.MaxInt/n {
		return nil, fmt.Errorf("%s: AllocSlots(%d x %d B): sizes must be positive and fit an int", d.name, n, size)
	}
	if d.isClosed() {
		return nil, d.errClosed(fmt.Sprintf("AllocSlots(%d x %d B)", n, size))
	}
	b, err := pagemap.Map(size * n)
	if err != nil {
		return nil, fmt.Errorf("%s: AllocSlots(%d x %d B): %w", d.name, n, size, err)
	}
	a := addrOf(b)
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, fmt.Errorf("%s: AllocSlots: %w (and %v)", d.name, d.errClosed("AllocSlots"), pagemap.Unmap(b))
	}
	d.pinned[a] = &pinnedBuf{b: b, fd: -1, slot: size}
	d.mu.Unlock()
	slots := make([]device.Pinned, n)
	for i := range slots {
		off := i * size
		slots[i] = device.NewPinned(b[off:off+size:off+size], device.Addr(a+uintptr(off)))
	}
	return slots, nil
}

// RenewSlot maps fresh pages over slot (see device.SlotRenewer). The
// device lock is held across the mmap so that Close or FreeSlots cannot
// unmap the slab meanwhile: a fixed mapping made after that would land
// in address space that is no longer ours.
func (d *Dev) RenewSlot(slot device.Pinned) (device.Pinned, error) {
	h := slot.Host()
	a := addrOf(h)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return device.Pinned{}, d.errClosed(fmt.Sprintf("RenewSlot(%#x)", a))
	}
	if buf := d.slabOf(a); buf == nil || (a-addrOf(buf.b))%uintptr(buf.slot) != 0 || len(h) != buf.slot || slot.DeviceAddr() != device.Addr(a) {
		return device.Pinned{}, fmt.Errorf("%s: RenewSlot(%#x, %d B): not a whole slot of an AllocSlots slab: %w", d.name, a, len(h), device.ErrBadHandle)
	}
	if err := pagemap.Renew(h); err != nil {
		return device.Pinned{}, fmt.Errorf("%s: renew slot at %#x: %w", d.name, a, err)
	}
	return slot, nil
}

// FreeSlots unmaps the slab AllocSlots returned slots of.
func (d *Dev) FreeSlots(slots []device.Pinned) error {
	if len(slots) == 0 {
		return fmt.Errorf("%s: FreeSlots: no slots", d.name)
	}
	a := addrOf(slots[0].Host())
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return d.errClosed(fmt.Sprintf("FreeSlots(%#x)", a))
	}
	buf := d.pinned[a]
	if buf == nil || buf.slot == 0 || buf.slot*len(slots) != len(buf.b) {
		d.mu.Unlock()
		return fmt.Errorf("%s: FreeSlots(%#x, %d slots): not every slot of an AllocSlots slab (freed twice?): %w", d.name, a, len(slots), device.ErrBadHandle)
	}
	delete(d.pinned, a)
	d.mu.Unlock()
	return d.freeBuf(buf)
}

// slabOf finds the AllocSlots slab holding address a; d.mu is held.
func (d *Dev) slabOf(a uintptr) *pinnedBuf {
	for base, buf := range d.pinned {
		if buf.slot > 0 && a >= base && a < base+uintptr(len(buf.b)) {
			return buf
		}
	}
	return nil
}

func (d *Dev) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}
