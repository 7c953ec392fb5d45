package kvsim

import (
	"fmt"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/hostmem"
	"github.com/stage-kv/stage/wire"
)

// Memory is the engine-side allocation a cache lives in: emulated device
// memory (a memfd) or real device memory. The sidecar gets its own mapping
// through Region; the engine reads and writes through ReadAt and WriteAt.
type Memory interface {
	Size() uint64
	// Region describes window [off, off+length) for registration.
	Region(name string, off, length uint64, access wire.Access) client.Region
	WriteAt(p []byte, off uint64) error
	ReadAt(p []byte, off uint64) error
	// Host returns the bytes when the engine can address them directly
	// (memfd), else nil.
	Host() []byte
	Close() error
}

// HostMemory is a memfd, the hostmem backend's device memory.
type HostMemory struct{ s *hostmem.Shared }

// NewHostMemory allocates size bytes of shared memory.
func NewHostMemory(name string, size uint64) (*HostMemory, error) {
	s, err := hostmem.NewShared(name, int(size))
	if err != nil {
		return nil, err
	}
	return &HostMemory{s: s}, nil
}

func (m *HostMemory) Size() uint64 { return uint64(m.s.Size()) }
func (m *HostMemory) Host() []byte { return m.s.Bytes() }
func (m *HostMemory) Close() error { return m.s.Close() }

func (m *HostMemory) Region(name string, off, length uint64, access wire.Access) client.Region {
	return client.Region{Name: name, Handle: uint8(device.HandleMemfd), Access: access,
		AllocSize: m.Size(), Offset: off, Length: length, FD: m.s.FD()}
}

func (m *HostMemory) WriteAt(p []byte, off uint64) error {
	if off+uint64(len(p)) > m.Size() {
		return fmt.Errorf("kvsim: write of %d B at %d past %d B", len(p), off, m.Size())
	}
	copy(m.s.Bytes()[off:], p)
	return nil
}

func (m *HostMemory) ReadAt(p []byte, off uint64) error {
	if off+uint64(len(p)) > m.Size() {
		return fmt.Errorf("kvsim: read of %d B at %d past %d B", len(p), off, m.Size())
	}
	copy(p, m.s.Bytes()[off:])
	return nil
}
