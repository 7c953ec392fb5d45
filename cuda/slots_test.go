package cuda

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stage-kv/stage/device"
)

// Each slot is registered on its own; renewal unregisters the slot, maps
// fresh pages and registers them again (the fake refuses a range
// registered twice and an unregister of what is not registered), keeps
// the address, zeroes the slot and leaves its neighbours alone; FreeSlots
// lets go of everything (the fake's leak check at cleanup).
func TestFakeSlotsRenew(t *testing.T) {
	l := fakeLibrary(t)
	d := openFake(t, l, Config{PTX: fakePTX})
	pg := os.Getpagesize()
	slots, err := d.AllocSlots(2*pg, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.openResources(); got != "3 registered host buffers, 1 slot slab" {
		t.Fatalf("after AllocSlots: open resources %q", got)
	}
	for i, s := range slots {
		for j := range s.Host() {
			s.Host()[j] = byte(i + 1)
		}
	}
	renewed, err := d.RenewSlot(slots[1])
	if err != nil {
		t.Fatal(err)
	}
	if &renewed.Host()[0] != &slots[1].Host()[0] || renewed.DeviceAddr() == 0 {
		t.Fatalf("renewed slot moved or lost its device view: %p dev %#x", &renewed.Host()[0], uint64(renewed.DeviceAddr()))
	}
	slots[1] = renewed
	for i, s := range slots {
		want := byte(i + 1)
		if i == 1 {
			want = 0
		}
		for j, v := range s.Host() {
			if v != want {
				t.Fatalf("slot %d byte %d: got %d, want %d", i, j, v, want)
			}
		}
	}
	if _, err := d.RenewSlot(slots[0].Slice(0, pg)); !errors.Is(err, device.ErrBadHandle) {
		t.Fatalf("renew half a slot: got %v, want ErrBadHandle", err)
	}
	if err := d.FreeSlots(slots[:2]); !errors.Is(err, device.ErrBadHandle) {
		t.Fatalf("FreeSlots of part of the slab: got %v, want ErrBadHandle", err)
	}
	if err := d.FreeSlots(slots); err != nil {
		t.Fatal(err)
	}
	if got := d.openResources(); got != "" {
		t.Fatalf("after FreeSlots: open resources %q", got)
	}
}

// A slot left unregistered by a failed renewal is still freed, and the
// driver's refusal to register a range twice is reported with its name.
func TestFakeSlotsRegisterTwice(t *testing.T) {
	l := fakeLibrary(t)
	d := openFake(t, l, Config{PTX: fakePTX})
	pg := os.Getpagesize()
	slots, err := d.AllocSlots(pg, 2)
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.RegisterHost(slots[0].Host())
	if err == nil || !strings.Contains(err.Error(), "ALREADY_REGISTERED") {
		t.Fatalf("registering a slot twice: got %v, want CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", err)
	}
	if err := d.UnregisterHost(slots[1]); err != nil { // as a failed renewal leaves it
		t.Fatal(err)
	}
	if err := d.FreeSlots(slots); err != nil {
		t.Fatal(err)
	}
}
