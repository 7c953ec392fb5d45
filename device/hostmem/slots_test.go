package hostmem

import (
	"errors"
	"os"
	"testing"

	"github.com/stage-kv/stage/device"
)

// Slots gather like AllocPinned buffers; a renewed slot reads zero at the
// same address while its neighbours keep their bytes; FreeSlots frees the
// slab once.
func TestSlotsRenew(t *testing.T) {
	d := newDev(t, Config{})
	pg := os.Getpagesize()
	slots, err := d.AllocSlots(2*pg, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Stats().PinnedBuffers; got != 1 {
		t.Fatalf("pinned buffers after AllocSlots: got %d, want 1", got)
	}
	src := allocPinnedT(t, d, 2*pg)
	for i := range src.Host() {
		src.Host()[i] = byte(i%251 + 1)
	}
	s := newStreamT(t, d)
	for _, sl := range slots {
		if sl.DeviceAddr() != device.Addr(addrOf(sl.Host())) {
			t.Fatalf("slot device view %#x, host %#x: want equal", uint64(sl.DeviceAddr()), addrOf(sl.Host()))
		}
		if err := s.Gather(sl, []device.Seg{{Addr: src.DeviceAddr(), Len: uint64(src.Len())}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	before := addrOf(slots[1].Host())
	renewed, err := d.RenewSlot(slots[1])
	if err != nil {
		t.Fatal(err)
	}
	if addrOf(renewed.Host()) != before || renewed.Len() != 2*pg {
		t.Fatalf("renewed slot at %#x (%d B), want %#x (%d B)", addrOf(renewed.Host()), renewed.Len(), before, 2*pg)
	}
	for i, sl := range slots {
		for j, v := range sl.Host() {
			want := src.Host()[j]
			if i == 1 {
				want = 0
			}
			if v != want {
				t.Fatalf("slot %d byte %d: got %d, want %d", i, j, v, want)
			}
		}
	}
	slots[1] = renewed
	if err := d.FreeSlots(slots); err != nil {
		t.Fatal(err)
	}
	if got := d.Stats().PinnedBuffers; got != 1 { // src is still there
		t.Fatalf("pinned buffers after FreeSlots: got %d, want 1", got)
	}
}

func TestSlotsMisuse(t *testing.T) {
	d := newDev(t, Config{})
	pg := os.Getpagesize()
	slots, err := d.AllocSlots(pg, 2)
	if err != nil {
		t.Fatal(err)
	}
	other := allocPinnedT(t, d, pg)
	cases := []struct {
		name string
		do   func() error
		want error
	}{
		{"size not whole pages", func() error { _, err := d.AllocSlots(pg+1, 2); return err }, nil},
		{"renew a slice of a slot", func() error { _, err := d.RenewSlot(slots[0].Slice(0, pg/2)); return err }, device.ErrBadHandle},
		{"renew with a wrong device view", func() error { _, err := d.RenewSlot(device.NewPinned(slots[0].Host(), 8)); return err }, device.ErrBadHandle},
		{"renew an AllocPinned buffer", func() error { _, err := d.RenewSlot(other); return err }, device.ErrBadHandle},
		{"FreePinned a slot slab", func() error { return d.FreePinned(slots[0]) }, device.ErrBadHandle},
		{"FreeSlots of half the slab", func() error { return d.FreeSlots(slots[:1]) }, device.ErrBadHandle},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("got %v, want an error wrapping %v", err, tc.want)
			}
		})
	}
	if err := d.FreeSlots(slots); err != nil {
		t.Fatal(err)
	}
	if err := d.FreeSlots(slots); !errors.Is(err, device.ErrBadHandle) {
		t.Fatalf("second FreeSlots: got %v, want ErrBadHandle", err)
	}
}
