package hostmem

import (
	"errors"
	"fmt"
	"math"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/device"
)

// mapping is an imported allocation: a memfd mapped here (b != nil), or a
// range of this process wrapped as it is (HandleHostAddr, b == nil).
type mapping struct {
	d      *Dev
	kind   device.HandleKind
	base   device.Addr
	size   uint64
	b      []byte // the mmap, for munmap
	closed bool   // guarded by d.mu
}

var _ device.Mapping = (*mapping)(nil)

func (m *mapping) Base() device.Addr { return m.base }
func (m *mapping) Size() uint64      { return m.size }

// Close unmaps a memfd mapping (a HandleHostAddr one has nothing to unmap). A
// second Close returns an error wrapping device.ErrClosed and unmaps nothing.
func (m *mapping) Close() error {
	d := m.d
	d.mu.Lock()
	if m.closed {
		d.mu.Unlock()
		return fmt.Errorf("%s: close %s mapping at %#x (%d B): %w", d.name, m.kind, uint64(m.base), m.size, device.ErrClosed)
	}
	m.closed = true
	delete(d.mappings, m)
	d.mu.Unlock()
	if m.b == nil {
		return nil
	}
	if err := munmap(m.b); err != nil {
		return fmt.Errorf("%s: close %s mapping of %d B: %w", d.name, m.kind, m.size, err)
	}
	return nil
}

// Import maps an allocation shared with the sidecar:
//
//   - HandleMemfd: mmap of h.FD (MAP_SHARED, read-write), h.Size bytes from
//     offset 0. The fd must be a memfd sealed with F_SEAL_SHRINK (so its
//     owner cannot truncate it under a copy) and at least h.Size bytes
//     long; it stays the caller's and may be closed as soon as Import
//     returns.
//   - HandleHostAddr: [h.Addr, h.Addr+h.Size) of this process, as it is.
//
// Other kinds fail with an error wrapping device.ErrNotSupported; bad
// handles with one wrapping device.ErrBadHandle.
func (d *Dev) Import(h device.Handle) (device.Mapping, error) {
	m, err := d.importHandle(h)
	if err != nil {
		return nil, fmt.Errorf("%s: import %s handle of %d B: %w", d.name, h.Kind, h.Size, err)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		var uerr error
		if m.b != nil {
			uerr = munmap(m.b)
		}
		return nil, errors.Join(d.errClosed("Import"), uerr)
	}
	d.mappings[m] = struct{}{}
	d.mu.Unlock()
	return m, nil
}

func (d *Dev) importHandle(h device.Handle) (*mapping, error) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("device %w", device.ErrClosed)
	}
	switch h.Kind {
	case device.HandleMemfd:
		return d.importMemfd(h)
	case device.HandleHostAddr:
		return d.importHostAddr(h)
	}
	return nil, fmt.Errorf("hostmem imports memfd and host-addr handles, not %s: %w", h.Kind, device.ErrNotSupported)
}

func (d *Dev) importMemfd(h device.Handle) (*mapping, error) {
	if h.Size == 0 {
		return nil, fmt.Errorf("size is 0: %w", device.ErrBadHandle)
	}
	if h.FD < 0 {
		return nil, fmt.Errorf("fd %d: %w", h.FD, device.ErrBadHandle)
	}
	if h.Size > math.MaxInt {
		return nil, fmt.Errorf("size %d does not fit in this process: %w", h.Size, device.ErrBadHandle)
	}
	var st unix.Stat_t
	if err := unix.Fstat(h.FD, &st); err != nil {
		return nil, sysErr(fmt.Sprintf("fstat(fd %d)", h.FD), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("fd %d is not a memfd (mode %#o): %w", h.FD, st.Mode, device.ErrBadHandle)
	}
	// Sealed before the size is read: once F_SEAL_SHRINK is on, the
	// size fstat gave can only stay or grow.
	if err := device.CheckNoShrink(h.FD); err != nil {
		return nil, err
	}
	if err := unix.Fstat(h.FD, &st); err != nil {
		return nil, sysErr(fmt.Sprintf("fstat(fd %d)", h.FD), err)
	}
	if st.Size < 0 || uint64(st.Size) < h.Size {
		return nil, fmt.Errorf("fd %d is %d B, smaller than the %d B the handle claims: %w", h.FD, st.Size, h.Size, device.ErrBadHandle)
	}
	b, err := unix.Mmap(h.FD, 0, int(h.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, sysErr(fmt.Sprintf("mmap(fd %d, %d, PROT_READ|PROT_WRITE, MAP_SHARED)", h.FD, h.Size), err)
	}
	return &mapping{d: d, kind: h.Kind, base: device.Addr(addrOf(b)), size: h.Size, b: b}, nil
}

func (d *Dev) importHostAddr(h device.Handle) (*mapping, error) {
	if h.Size == 0 {
		return nil, fmt.Errorf("size is 0: %w", device.ErrBadHandle)
	}
	if h.Addr == 0 {
		return nil, fmt.Errorf("address 0: %w", device.ErrBadHandle)
	}
	if end := uint64(h.Addr) + h.Size; end < uint64(h.Addr) || end-1 > uint64(math.MaxUint) {
		return nil, fmt.Errorf("range %#x + %d B wraps around the address space: %w", uint64(h.Addr), h.Size, device.ErrBadHandle)
	}
	return &mapping{d: d, kind: h.Kind, base: h.Addr, size: h.Size}, nil
}
