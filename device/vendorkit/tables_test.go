package vendorkit

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stage-kv/stage/device"
)

func TestTakePin(t *testing.T) {
	buf := make([]byte, 64)
	other := make([]byte, 8)
	wrongKind := func(reg bool) string {
		if reg {
			return "buffer came from RegisterHost; use UnregisterHost"
		}
		return ""
	}
	for _, tc := range []struct {
		name   string
		rec    bool
		h      []byte
		wrong  func(bool) string
		closed bool
		want   string // "" : taken
	}{
		{name: "whole buffer", h: buf},
		{name: "empty", h: nil, want: "FreePinned: empty buffer"},
		{name: "not ours", h: other, want: "not a buffer of this device"},
		{name: "a slice", h: buf[:32], want: "got 32 B, the buffer is 64 B (pass the whole buffer, not a slice)"},
		{name: "wrong kind", rec: true, h: buf, wrong: wrongKind, want: "buffer came from RegisterHost; use UnregisterHost"},
		{name: "right kind", rec: false, h: buf, wrong: wrongKind},
		{name: "closed", h: buf, closed: true, want: "FreePinned: " + device.ErrClosed.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCore(t)
			pins := Pins[bool]{}
			pins.Add(c, buf, tc.rec)
			if tc.closed {
				c.Shut(func() string { return "" })
			}
			key, rec, err := TakePin(c, pins, "FreePinned", tc.h, tc.wrong)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "acl: acl:3: FreePinned") {
					t.Fatalf("TakePin: %v, want an error with %q", err, tc.want)
				}
				if len(pins) != 1 {
					t.Errorf("a refused take removed the buffer")
				}
				return
			}
			if err != nil || key == 0 || rec.N != 64 || rec.Rec != tc.rec || len(pins) != 0 {
				t.Fatalf("TakePin: key %#x, rec %+v, err %v, %d left", key, rec, err, len(pins))
			}
		})
	}
}

func TestAllocFreeDevice(t *testing.T) {
	c := newCore(t)
	mem := map[device.Addr]uint64{}
	next := device.Addr(0x1000)
	alloc := func(n uint64) (device.Addr, error) {
		if n > 1<<20 {
			return 0, errors.New("out of memory")
		}
		a := next
		next += device.Addr(n)
		return a, nil
	}
	if _, err := AllocDevice(c, mem, 0, alloc, func(n uint64) uint64 { return n }); err == nil || err.Error() != "acl: acl:3: AllocDevice(0): size must be positive" {
		t.Errorf("AllocDevice(0): %v", err)
	}
	if _, err := AllocDevice(c, mem, 2<<20, alloc, func(n uint64) uint64 { return n }); err == nil || len(mem) != 0 {
		t.Errorf("a failed allocation: %v, %d recorded", err, len(mem))
	}
	a, err := AllocDevice(c, mem, 256, alloc, func(n uint64) uint64 { return n })
	if err != nil || mem[a] != 256 {
		t.Fatalf("AllocDevice(256): %#x, %v, recorded %d", a, err, mem[a])
	}
	var freed []string
	free := func(a device.Addr, n uint64) error {
		freed = append(freed, fmt.Sprintf("%#x/%d", uint64(a), n))
		return nil
	}
	if err := FreeDevice(c, mem, a+1, free); err == nil || err.Error() != "acl: acl:3: FreeDevice(0x1001): not an allocation of this device" {
		t.Errorf("FreeDevice of an interior address: %v", err)
	}
	if err := FreeDevice(c, mem, a, free); err != nil || len(mem) != 0 || len(freed) != 1 || freed[0] != "0x1000/256" {
		t.Errorf("FreeDevice: %v, %d left, freed %v", err, len(mem), freed)
	}
	if err := FreeDevice(c, mem, a, free); err == nil || len(freed) != 1 {
		t.Errorf("FreeDevice twice: %v, freed %v", err, freed)
	}
	b, _ := AllocDevice(c, mem, 16, alloc, func(n uint64) uint64 { return n })
	c.Shut(func() string { return "" })
	if err := FreeDevice(c, mem, b, free); !errors.Is(err, device.ErrClosed) || len(mem) != 1 {
		t.Errorf("FreeDevice on a closed device: %v, %d left", err, len(mem))
	}
	if _, err := AllocDevice(c, mem, 16, alloc, func(n uint64) uint64 { return n }); !errors.Is(err, device.ErrClosed) {
		t.Errorf("AllocDevice on a closed device: %v", err)
	}
}

func TestSyncCopies(t *testing.T) {
	c := newCore(t)
	calls := 0
	htod := func(device.Addr, []byte) error { calls++; return nil }
	dtoh := func([]byte, device.Addr) error { calls++; return nil }
	if err := CopyHtoD(c, 0x10, nil, htod); err != nil || calls != 0 {
		t.Errorf("CopyHtoD of nothing: %v, %d calls", err, calls)
	}
	if err := CopyDtoH(c, nil, 0x10, dtoh); err != nil || calls != 0 {
		t.Errorf("CopyDtoH of nothing: %v, %d calls", err, calls)
	}
	if err := CopyHtoD(c, 0x10, []byte{1}, htod); err != nil || calls != 1 {
		t.Errorf("CopyHtoD: %v, %d calls", err, calls)
	}
	if err := CopyDtoH(c, []byte{1}, 0x10, dtoh); err != nil || calls != 2 {
		t.Errorf("CopyDtoH: %v, %d calls", err, calls)
	}
	c.Shut(func() string { return "" })
	if err := CopyHtoD(c, 0x10, nil, htod); err != nil {
		t.Errorf("CopyHtoD of nothing on a closed device: %v (nothing to copy comes first)", err)
	}
	if err := CopyHtoD(c, 0x10, []byte{1}, htod); !errors.Is(err, device.ErrClosed) || !strings.Contains(err.Error(), "CopyHtoD") {
		t.Errorf("CopyHtoD on a closed device: %v", err)
	}
	if err := CopyDtoH(c, []byte{1}, 0x10, dtoh); !errors.Is(err, device.ErrClosed) || !strings.Contains(err.Error(), "CopyDtoH") || calls != 2 {
		t.Errorf("CopyDtoH on a closed device: %v, %d calls", err, calls)
	}
}

func TestExportBase(t *testing.T) {
	handle := func(b device.Addr, n uint64) ([]byte, error) { return []byte(fmt.Sprintf("h%x/%d", uint64(b), n)), nil }
	for _, tc := range []struct {
		name       string
		addr       device.Addr
		base       device.Addr
		size       uint64
		rangeErr   error
		want       string // error text; "" : exported
		wantOffset uint64
	}{
		{name: "base", addr: 0x1000, base: 0x1000, size: 0x100},
		{name: "interior", addr: 0x10ff, base: 0x1000, size: 0x100, wantOffset: 0xff},
		{name: "past the end", addr: 0x1100, base: 0x1000, size: 0x100, want: "Export(0x1100): the allocation found (base 0x1000, 256 B) does not hold the address"},
		{name: "below the base", addr: 0xfff, base: 0x1000, size: 0x100, want: "does not hold the address"},
		{name: "empty allocation", addr: 0x1000, base: 0x1000, size: 0, want: "does not hold the address"},
		{name: "runtime refuses", addr: 0x1000, rangeErr: errors.New("cuMemGetAddressRange(0x1000): CUDA_ERROR_INVALID_VALUE"), want: "CUDA_ERROR_INVALID_VALUE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCore(t)
			alloc := func(device.Addr) (device.Addr, uint64, error) { return tc.base, tc.size, tc.rangeErr }
			e, err := ExportBase(c, tc.addr, device.HandleCUDAIPC, alloc, handle)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("ExportBase: %+v, %v; want an error with %q", e, err, tc.want)
				}
				return
			}
			want := device.Export{Handle: device.Handle{Kind: device.HandleCUDAIPC, Bytes: []byte(fmt.Sprintf("h%x/%d", uint64(tc.base), tc.size)), Size: tc.size, FD: -1},
				Base: tc.base, Offset: tc.wantOffset}
			if err != nil || string(e.Handle.Bytes) != string(want.Handle.Bytes) || e.Handle.Kind != want.Handle.Kind || e.Handle.Size != want.Handle.Size ||
				e.Handle.FD != -1 || e.Base != want.Base || e.Offset != want.Offset {
				t.Fatalf("ExportBase: %+v, %v; want %+v", e, err, want)
			}
		})
	}
	c := newCore(t)
	c.Shut(func() string { return "" })
	if _, err := ExportBase(c, 0x1000, device.HandleHIPIPC, nil, nil); !errors.Is(err, device.ErrClosed) {
		t.Errorf("ExportBase on a closed device: %v", err)
	}
}
