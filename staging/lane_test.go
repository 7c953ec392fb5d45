package staging_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/hostmem"
	"github.com/stage-kv/stage/staging"
)

// streamOnly hides the device's synchronous copies, so a Lane must use a
// stream and an event.
type streamOnly struct{ device.Device }

func TestLane(t *testing.T) {
	for _, tc := range []struct {
		name string
		wrap func(*hostmem.Dev) device.Device
	}{
		{"sync copier", func(d *hostmem.Dev) device.Device { return d }},
		{"stream and event", func(d *hostmem.Dev) device.Device { return streamOnly{d} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hd := openDev(t)
			defer hd.Close()
			dev := tc.wrap(hd)
			mem, err := hostmem.NewShared("lane", 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			defer mem.Close()
			m, err := dev.Import(mem.Handle())
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			for i := range mem.Bytes() {
				mem.Bytes()[i] = byte(i % 251)
			}
			pool, err := staging.NewPool(dev, 64<<10, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			lane, err := staging.NewLane(dev)
			if err != nil {
				t.Fatal(err)
			}
			defer lane.Close()
			buf := pool.Slot(0).Slice(0, 4096+7)
			src := []device.Seg{{Addr: m.Base() + 123, Len: 4096}, {Addr: m.Base() + 9000, Len: 7}}
			if err := lane.Gather(buf, src); err != nil {
				t.Fatalf("Gather: %v", err)
			}
			want := append(append([]byte(nil), mem.Bytes()[123:123+4096]...), mem.Bytes()[9000:9007]...)
			if !bytes.Equal(buf.Host(), want) {
				t.Fatal("Gather: wrong bytes")
			}
			dst := []device.Seg{{Addr: m.Base() + 500000, Len: 4103}}
			if err := lane.Scatter(dst, buf); err != nil {
				t.Fatalf("Scatter: %v", err)
			}
			if !bytes.Equal(mem.Bytes()[500000:500000+4103], want) {
				t.Fatal("Scatter: wrong bytes")
			}
			// A failed copy is reported, and the next one works.
			hd.FailAfter(0)
			if err := lane.Scatter(dst, buf); !errors.Is(err, hostmem.ErrInjected) {
				t.Fatalf("Scatter with a fault: got %v, want ErrInjected", err)
			}
			hd.FailAfter(-1)
			if err := lane.Gather(buf, src); err != nil {
				t.Fatalf("Gather after a failure: %v", err)
			}
		})
	}
}
