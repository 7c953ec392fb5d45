package hostmem

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stage-kv/stage/device"
)

func TestCopyDtoD(t *testing.T) {
	d := newDev(t, Config{})
	src, err := NewShared("src", 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := NewShared("dst", 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i * 7)
	}
	st, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dd, ok := st.(device.DtoD)
	if !ok {
		t.Fatalf("hostmem stream %T does not implement device.DtoD", st)
	}
	sa, da := device.Addr(addrOf(src.Bytes())), device.Addr(addrOf(dst.Bytes()))
	if err := dd.CopyDtoD(da+100, sa+200, 1000); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst.Bytes()[100:1100], src.Bytes()[200:1200]) {
		t.Fatal("dtod: destination differs from source")
	}
	if dst.Bytes()[99] != 0 || dst.Bytes()[1100] != 0 {
		t.Fatal("dtod wrote outside its range")
	}
	if err := dd.CopyDtoD(0, sa, 1); err == nil {
		t.Fatal("dtod to address 0: got nil error")
	}
	if err := dd.CopyDtoD(da, ^device.Addr(0)-2, 8); err == nil {
		t.Fatal("dtod wrapping the address space: got nil error")
	}
	d.FailAfter(0)
	if err := dd.CopyDtoD(da, sa, 8); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); !errors.Is(err, ErrInjected) {
		t.Fatalf("injected dtod failure: got %v, want ErrInjected", err)
	}
}

func TestRegisterHost(t *testing.T) {
	d := newDev(t, Config{})
	sh, err := NewShared("ring", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	p, err := d.RegisterHost(sh.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if p.DeviceAddr() != device.Addr(addrOf(sh.Bytes())) || p.Len() != 4096 {
		t.Fatalf("got pinned %#x/%d, want the buffer's own address and length", uint64(p.DeviceAddr()), p.Len())
	}
	if _, err := d.RegisterHost(sh.Bytes()); !errors.Is(err, device.ErrBadHandle) {
		t.Fatalf("second RegisterHost: got %v, want ErrBadHandle", err)
	}
	if err := d.UnregisterHost(p.Slice(0, 10)); !errors.Is(err, device.ErrBadHandle) {
		t.Fatalf("UnregisterHost of a slice: got %v, want ErrBadHandle", err)
	}
	if err := d.UnregisterHost(p); err != nil {
		t.Fatal(err)
	}
	if err := d.UnregisterHost(p); !errors.Is(err, device.ErrBadHandle) {
		t.Fatalf("second UnregisterHost: got %v, want ErrBadHandle", err)
	}
}
