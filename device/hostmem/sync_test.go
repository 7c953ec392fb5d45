package hostmem

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stage-kv/stage/device"
)

func TestSyncCopies(t *testing.T) {
	d := newDev(t, Config{})
	sh, m := newSharedT(t, d, 1<<16)
	for i := range sh.Bytes() {
		sh.Bytes()[i] = byte(i * 7)
	}
	p := allocPinnedT(t, d, 300)
	segs := []device.Seg{sg(m.Base()+1000, 100), sg(m.Base()+5, 200)}
	if err := d.GatherSync(p, segs); err != nil {
		t.Fatalf("GatherSync: %v", err)
	}
	want := append(append([]byte(nil), sh.Bytes()[1000:1100]...), sh.Bytes()[5:205]...)
	if !bytes.Equal(p.Host(), want) {
		t.Fatalf("GatherSync: bytes differ at %d", firstDiff(p.Host(), want))
	}
	// Scatter them back elsewhere, reversed in order.
	back := []device.Seg{sg(m.Base()+40000, 100), sg(m.Base()+50000, 200)}
	if err := d.ScatterSync(back, p); err != nil {
		t.Fatalf("ScatterSync: %v", err)
	}
	if got := sh.Bytes()[40000:40100]; !bytes.Equal(got, want[:100]) {
		t.Errorf("ScatterSync: first segment differs at %d", firstDiff(got, want[:100]))
	}
	if got := sh.Bytes()[50000:50200]; !bytes.Equal(got, want[100:]) {
		t.Errorf("ScatterSync: second segment differs at %d", firstDiff(got, want[100:]))
	}

	for _, tc := range []struct {
		name string
		segs []device.Seg
	}{
		{"short", []device.Seg{sg(m.Base(), 10)}},
		{"only an empty segment", []device.Seg{sg(m.Base(), 0)}},
		{"address 0", []device.Seg{sg(0, 300)}},
		{"none", nil},
	} {
		if err := d.GatherSync(p, tc.segs); err == nil {
			t.Errorf("GatherSync %s: got nil, want an error", tc.name)
		}
	}
	d.FailAfter(0)
	if err := d.ScatterSync(back, p); !errors.Is(err, ErrInjected) {
		t.Errorf("ScatterSync with an injected fault: got %v, want ErrInjected", err)
	}
}

func TestSyncCopyAfterClose(t *testing.T) {
	d, err := Open(0, device.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.AllocPinned(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.FreePinned(p); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	hd := d.(*Dev)
	if err := hd.GatherSync(p, []device.Seg{sg(1, 64)}); !errors.Is(err, device.ErrClosed) {
		t.Errorf("GatherSync after Close: got %v, want ErrClosed", err)
	}
}
