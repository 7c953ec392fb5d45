package acl

import (
	"fmt"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/wire"
)

// aclMemory is engine memory on an ACL device for kvsim (kvsim.Memory),
// shared with a sidecar by export key. The cache's window sits at an odd
// offset inside a larger allocation, so registration must carry the
// sub-allocation offset for the right bytes to move.
type aclMemory struct {
	d     *Device
	base  device.Addr // the allocation
	addr  device.Addr // the cache's first byte: base + slack + odd
	size  uint64
	key   string
	hoff  uint64 // addr's offset inside the allocation the key names
	asize uint64
}

const aclSlack = 1 << 20

// newACLMemory allocates size bytes (plus slack on both sides) on d and
// exports them to the process importer (the sidecar's pid).
func newACLMemory(d *Device, size uint64, importer int32) (*aclMemory, error) {
	base, err := d.AllocDevice(size + 2*aclSlack)
	if err != nil {
		return nil, err
	}
	m := &aclMemory{d: d, base: base, addr: base + aclSlack + 256 + 16, size: size}
	x, err := d.Export(m.addr, importer)
	if err != nil {
		_ = d.FreeDevice(base)
		return nil, err
	}
	m.key, m.hoff, m.asize = string(x.Handle.Bytes), x.Offset, x.Handle.Size
	return m, nil
}

func (m *aclMemory) Size() uint64 { return m.size }
func (m *aclMemory) Host() []byte { return nil }
func (m *aclMemory) Close() error { return m.d.FreeDevice(m.base) }

func (m *aclMemory) Region(name string, off, length uint64, access wire.Access) client.Region {
	return client.Region{Name: name, Handle: uint8(device.HandleACLKey), Access: access, Ordinal: uint32(m.d.Ordinal()),
		AllocSize: m.asize, Offset: m.hoff + off, Length: length, HandleRaw: []byte(m.key), FD: -1}
}

func (m *aclMemory) WriteAt(p []byte, off uint64) error {
	if off+uint64(len(p)) > m.size {
		return fmt.Errorf("aclMemory: write of %d B at %d past %d B", len(p), off, m.size)
	}
	return m.d.CopyHtoD(m.addr+device.Addr(off), p)
}

func (m *aclMemory) ReadAt(p []byte, off uint64) error {
	if off+uint64(len(p)) > m.size {
		return fmt.Errorf("aclMemory: read of %d B at %d past %d B", len(p), off, m.size)
	}
	return m.d.CopyDtoH(p, m.addr+device.Addr(off))
}
