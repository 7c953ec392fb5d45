package hostmem

import (
	"fmt"
	"math"
	"time"

	"github.com/stage-kv/stage/device"
)

var (
	_ device.DtoD           = (*stream)(nil)
	_ device.HostRegisterer = (*Dev)(nil)
)

// CopyDtoD enqueues a copy of n bytes from src to dst, both addresses of
// this process (mappings, pinned buffers). n == 0 enqueues nothing. Fault
// injection and the speed model (on the gather link) apply as to Gather.
func (s *stream) CopyDtoD(dst, src device.Addr, n uint64) error {
	if n == 0 {
		return nil
	}
	for _, a := range []device.Addr{dst, src} {
		if a == 0 {
			return fmt.Errorf("%s: dtod of %d B: address 0", s.name, n)
		}
		if end := uint64(a) + n; end < uint64(a) || end-1 > uint64(math.MaxUint) {
			return fmt.Errorf("%s: dtod: %#x + %d B wraps around the address space", s.name, uint64(a), n)
		}
	}
	return s.send(op{kind: opDtoD, dst: dst, src: src, n: n})
}

// exec runs one copy op.
func (s *stream) exec(o *op) error {
	if o.kind == opDtoD {
		return s.copyDtoD(o)
	}
	return s.copy(o)
}

// copyDtoD runs one device-to-device op.
func (s *stream) copyDtoD(o *op) error {
	d := s.d
	if d.injectFault() {
		d.failed.Add(1)
		return fmt.Errorf("%s: dtod of %d B %#x -> %#x: %w", s.name, o.n, uint64(o.src), uint64(o.dst), ErrInjected)
	}
	start := time.Now()
	if err := copyDtoDGuarded(bytesAt(o.dst, o.n), bytesAt(o.src, o.n)); err != nil { // see bytesAt for why this is safe
		d.failed.Add(1)
		return fmt.Errorf("%s: %w", s.name, err)
	}
	if d.bw > 0 || d.lat > 0 {
		end := start
		if d.bw > 0 {
			end = d.d2h.reserve(start, time.Duration(float64(o.n)/d.bw*float64(time.Second)))
		}
		waitUntil(end.Add(d.lat))
	}
	d.copies.Add(1)
	d.bytes.Add(o.n)
	return nil
}

// RegisterHost gives b, mapped by the caller, a device view: on hostmem
// that is its own address. It is counted until UnregisterHost.
func (d *Dev) RegisterHost(b []byte) (device.Pinned, error) {
	if len(b) == 0 {
		return device.Pinned{}, fmt.Errorf("%s: RegisterHost: empty buffer", d.name)
	}
	a := addrOf(b)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return device.Pinned{}, d.errClosed("RegisterHost")
	}
	if _, dup := d.registered[a]; dup {
		return device.Pinned{}, fmt.Errorf("%s: RegisterHost(%#x, %d B): already registered: %w", d.name, a, len(b), device.ErrBadHandle)
	}
	d.registered[a] = len(b)
	return device.NewPinned(b, device.Addr(a)), nil
}

// UnregisterHost forgets a RegisterHost buffer (pass what it returned).
func (d *Dev) UnregisterHost(p device.Pinned) error {
	a := addrOf(p.Host())
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return d.errClosed("UnregisterHost")
	}
	n, ok := d.registered[a]
	if !ok || n != p.Len() {
		return fmt.Errorf("%s: UnregisterHost(%#x, %d B): not a registered buffer (registered: %d B): %w", d.name, a, p.Len(), n, device.ErrBadHandle)
	}
	delete(d.registered, a)
	return nil
}
