package vendorkit

import (
	"unsafe"

	"github.com/stage-kv/stage/device"
)

// Pin is a pinned host buffer a device handed out: its length and what the
// backend keeps of it.
type Pin[R any] struct {
	N   int
	Rec R
}

// Pins is a device's pinned host buffers by host address, guarded by
// Core.Mu.
type Pins[R any] map[uintptr]Pin[R]

// Add records the buffer b, under Mu.
func (p Pins[R]) Add(c *Core, b []byte, rec R) {
	c.Mu.Lock()
	p[uintptr(unsafe.Pointer(&b[0]))] = Pin[R]{N: len(b), Rec: rec}
	c.Mu.Unlock()
}

// TakePin removes the buffer h from pins for op (FreePinned,
// UnregisterHost), refusing an empty buffer, a closed device, a buffer
// pins lacks, one that wrong refuses (it returns why, "" to accept; nil
// accepts all) and a slice of a buffer instead of the whole. It returns
// the buffer's address and record.
func TakePin[R any](c *Core, pins Pins[R], op string, h []byte, wrong func(R) string) (uintptr, Pin[R], error) {
	if len(h) == 0 {
		return 0, Pin[R]{}, c.Errorf("%s: empty buffer", op)
	}
	key := uintptr(unsafe.Pointer(&h[0]))
	c.Mu.Lock()
	defer c.Mu.Unlock()
	if c.closed.Load() {
		return 0, Pin[R]{}, c.ErrClosed(op)
	}
	rec, ok := pins[key]
	if !ok {
		return 0, Pin[R]{}, c.Errorf("%s(%#x): not a buffer of this device", op, key)
	}
	if wrong != nil {
		if why := wrong(rec.Rec); why != "" {
			return 0, Pin[R]{}, c.Errorf("%s(%#x): %s", op, key, why)
		}
	}
	if rec.N != len(h) {
		return 0, Pin[R]{}, c.Errorf("%s(%#x): got %d B, the buffer is %d B (pass the whole buffer, not a slice)", op, key, len(h), rec.N)
	}
	delete(pins, key)
	return key, rec, nil
}

// AllocDevice allocates n bytes of device memory with alloc, the runtime's
// call, and records it in mem as rec(n) (under Mu). n must be positive and
// the device open.
func AllocDevice[V any](c *Core, mem map[device.Addr]V, n uint64, alloc func(uint64) (device.Addr, error), rec func(uint64) V) (device.Addr, error) {
	if err := Positive(c, "AllocDevice", n); err != nil {
		return 0, err
	}
	a, err := alloc(n)
	if err != nil {
		return 0, err
	}
	c.Mu.Lock()
	mem[a] = rec(n)
	c.Mu.Unlock()
	return a, nil
}

// FreeDevice removes a, an allocation AllocDevice recorded in mem, and
// frees it with free, the runtime's calls. The device must be open.
func FreeDevice[V any](c *Core, mem map[device.Addr]V, a device.Addr, free func(device.Addr, V) error) error {
	c.Mu.Lock()
	if c.closed.Load() {
		c.Mu.Unlock()
		return c.ErrClosed("FreeDevice")
	}
	v, ok := mem[a]
	if !ok {
		c.Mu.Unlock()
		return c.Errorf("FreeDevice(%#x): not an allocation of this device", uint64(a))
	}
	delete(mem, a)
	c.Mu.Unlock()
	return free(a, v)
}

// CopyHtoD copies src to device address dst with htod, the runtime's
// synchronous copy; nothing to copy is done at once.
func CopyHtoD(c *Core, dst device.Addr, src []byte, htod func(device.Addr, []byte) error) error {
	if len(src) == 0 {
		return nil
	}
	if err := c.Check("CopyHtoD"); err != nil {
		return err
	}
	return htod(dst, src)
}

// CopyDtoH copies len(dst) bytes from device address src into dst with
// dtoh, the runtime's synchronous copy; nothing to copy is done at once.
func CopyDtoH(c *Core, dst []byte, src device.Addr, dtoh func([]byte, device.Addr) error) error {
	if len(dst) == 0 {
		return nil
	}
	if err := c.Check("CopyDtoH"); err != nil {
		return err
	}
	return dtoh(dst, src)
}

// ExportBase shares the allocation holding addr by a handle of its base:
// alloc finds the allocation (base and size, from the runtime or the
// backend's own table), handle makes the handle's bytes of the base. The
// result carries addr's offset inside the allocation: the importer opens
// the handle to the base and adds the offset back.
func ExportBase(c *Core, addr device.Addr, kind device.HandleKind, alloc func(device.Addr) (device.Addr, uint64, error), handle func(base device.Addr, n uint64) ([]byte, error)) (device.Export, error) {
	if err := c.Check("Export"); err != nil {
		return device.Export{}, err
	}
	b, n, err := alloc(addr)
	if err != nil {
		return device.Export{}, err
	}
	if n == 0 || addr < b || uint64(addr-b) >= n {
		return device.Export{}, c.Errorf("Export(%#x): the allocation found (base %#x, %d B) does not hold the address", uint64(addr), uint64(b), n)
	}
	bytes, err := handle(b, n)
	if err != nil {
		return device.Export{}, err
	}
	h := device.Handle{Kind: kind, Bytes: bytes, Size: n, FD: -1}
	return device.Export{Handle: h, Base: b, Offset: uint64(addr - b)}, nil
}
