package cuda

import (
	"errors"
	"fmt"
	"math"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/internal/pagemap"
)

var _ device.SlotRenewer = (*Device)(nil)

// slotSlab is an anonymous mapping cut into slots registered one by one.
type slotSlab struct {
	b    []byte
	slot int
}

// AllocSlots maps an anonymous slab of n slots of size bytes and registers
// each slot with the driver on its own (cuMemHostRegister
// PORTABLE|DEVICEMAP): a slot can then be unregistered, given fresh pages
// and registered again (RenewSlot) while its neighbours stay in use,
// which one cuMemHostAlloc buffer would not allow.
func (d *Device) AllocSlots(size, n int) ([]device.Pinned, error) {
	if size <= 0 || n <= 0 || size > math.MaxInt/n {
		return nil, fmt.Errorf("cuda: %s: AllocSlots(%d x %d B): sizes must be positive and fit an int", d, n, size)
	}
	if d.core.IsClosed() {
		return nil, d.core.ErrClosed("AllocSlots")
	}
	b, err := pagemap.Map(size * n)
	if err != nil {
		return nil, fmt.Errorf("cuda: %s: AllocSlots(%d x %d B): %w", d, n, size, err)
	}
	slots := make([]device.Pinned, 0, n)
	for i := 0; i < n; i++ {
		off := i * size
		p, err := d.RegisterHost(b[off : off+size : off+size])
		if err != nil {
			for _, q := range slots {
				err = errors.Join(err, d.UnregisterHost(q))
			}
			return nil, fmt.Errorf("cuda: %s: AllocSlots: register slot %d of %d: %w", d, i, n, errors.Join(err, pagemap.Unmap(b)))
		}
		slots = append(slots, p)
	}
	d.core.Mu.Lock()
	d.slabs[pagemap.Addr(b)] = slotSlab{b: b, slot: size}
	d.core.Mu.Unlock()
	return slots, nil
}

// RenewSlot unregisters slot, maps fresh pages over it and registers them
// (see device.SlotRenewer). The driver must not have the range registered
// while its pages are replaced, or it would keep the old ones pinned and
// mapped for the device. On error the slot may be left unregistered;
// FreeSlots copes.
func (d *Device) RenewSlot(slot device.Pinned) (device.Pinned, error) {
	d.slotMu.Lock()
	defer d.slotMu.Unlock()
	h := slot.Host()
	a := pagemap.Addr(h)
	d.core.Mu.Lock()
	sl, ok := d.slabOf(a)
	d.core.Mu.Unlock()
	if !ok || (a-pagemap.Addr(sl.b))%uintptr(sl.slot) != 0 || len(h) != sl.slot {
		return device.Pinned{}, fmt.Errorf("cuda: %s: RenewSlot(%#x, %d B): not a whole slot of an AllocSlots slab: %w", d, a, len(h), device.ErrBadHandle)
	}
	if err := d.UnregisterHost(slot); err != nil {
		return device.Pinned{}, fmt.Errorf("cuda: %s: renew slot at %#x: %w", d, a, err)
	}
	if err := pagemap.Renew(h); err != nil {
		return device.Pinned{}, fmt.Errorf("cuda: %s: renew slot at %#x: %w", d, a, err)
	}
	p, err := d.RegisterHost(h)
	if err != nil {
		return device.Pinned{}, fmt.Errorf("cuda: %s: renew slot at %#x: %w", d, a, err)
	}
	return p, nil
}

// FreeSlots unregisters every slot still registered and unmaps the slab.
func (d *Device) FreeSlots(slots []device.Pinned) error {
	d.slotMu.Lock()
	defer d.slotMu.Unlock()
	if len(slots) == 0 {
		return fmt.Errorf("cuda: %s: FreeSlots: no slots", d)
	}
	a := pagemap.Addr(slots[0].Host())
	d.core.Mu.Lock()
	sl, ok := d.slabs[a]
	if !ok || sl.slot*len(slots) != len(sl.b) {
		d.core.Mu.Unlock()
		return fmt.Errorf("cuda: %s: FreeSlots(%#x, %d slots): not every slot of an AllocSlots slab (freed twice?): %w", d, a, len(slots), device.ErrBadHandle)
	}
	delete(d.slabs, a)
	d.core.Mu.Unlock()
	var errs []error
	for _, p := range slots {
		d.core.Mu.Lock()
		rec, reg := d.pinned[pagemap.Addr(p.Host())]
		d.core.Mu.Unlock()
		if reg && rec.Rec {
			errs = append(errs, d.UnregisterHost(p))
		}
	}
	errs = append(errs, pagemap.Unmap(sl.b))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cuda: %s: FreeSlots: %w", d, err)
	}
	return nil
}

// slabOf finds the slab holding address a; d.mu is held.
func (d *Device) slabOf(a uintptr) (slotSlab, bool) {
	for base, sl := range d.slabs {
		if a >= base && a < base+uintptr(len(sl.b)) {
			return sl, true
		}
	}
	return slotSlab{}, false
}
