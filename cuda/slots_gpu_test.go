//go:build gpu

package cuda

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/devicetest"
)

// TestGPURenewSlot: on the real driver, a slot of an AllocSlots slab that
// was spliced into a pipe gets fresh pages (RenewSlot) and is registered
// again: copies through it move exact bytes, its neighbours are untouched,
// and the pipe still holds the bytes of the old pages.
func TestGPURenewSlot(t *testing.T) {
	for _, mode := range copyModes {
		t.Run(string(mode), func(t *testing.T) {
			d := openGPU(t, mode)
			const size, n = 4 << 20, 4
			pool, data := devicetest.Pool(t, d, 2*size, 7)
			slots, err := d.AllocSlots(size, n)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := d.FreeSlots(slots); err != nil {
					t.Error(err)
				}
			}()
			s, err := d.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			gather := func(slot device.Pinned, off int) {
				t.Helper()
				if err := s.Gather(slot, []device.Seg{{Addr: pool + device.Addr(off), Len: size}}); err != nil {
					t.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(slot.Host(), data[off:off+size]) {
					t.Fatalf("slot holds other bytes than device offset %d", off)
				}
			}
			gather(slots[1], 0)
			gather(slots[2], size)
			// The kernel takes slot 1's pages by reference, as a socket does.
			var p [2]int
			if err := unix.Pipe(p[:]); err != nil {
				t.Fatal(err)
			}
			defer unix.Close(p[0])
			defer unix.Close(p[1])
			if _, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, 1<<20); err != nil {
				t.Fatal(err)
			}
			iov := []unix.Iovec{{Base: &slots[1].Host()[0]}}
			iov[0].SetLen(1 << 20)
			if _, err := unix.Vmsplice(p[1], iov, 0); err != nil {
				t.Fatalf("vmsplice of a registered slot: %v", err)
			}
			t0 := time.Now()
			renewed, err := d.RenewSlot(slots[1])
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("RenewSlot of %d B took %v", size, time.Since(t0))
			slots[1] = renewed
			gather(slots[1], size) // the renewed slot, the other half
			got := make([]byte, 1<<20)
			if _, err := unix.Read(p[0], got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data[:1<<20]) {
				t.Fatal("the pipe lost the old pages' bytes when the slot was renewed")
			}
			if !bytes.Equal(slots[2].Host(), data[size:2*size]) {
				t.Fatal("renewing slot 1 changed slot 2")
			}
			// And host to device through the renewed slot.
			if err := s.Scatter([]device.Seg{{Addr: pool, Len: size}}, slots[1]); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			back := make([]byte, size)
			if err := d.CopyDtoH(back, pool); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, data[size:2*size]) {
				t.Fatal("scatter from the renewed slot moved other bytes")
			}
		})
	}
}
