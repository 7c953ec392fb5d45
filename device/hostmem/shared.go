package hostmem

import (
	"errors"
	"fmt"
	"sync"

	"github.com/stage-kv/stage/device"
)

// Shared is "device memory" on the engine side: a memfd mapped shared into
// the process that made it. The engine hands Handle() (the fd travels with
// SCM_RIGHTS) to its sidecar, whose Import maps the same pages, so bytes
// written through one mapping are read through the other.
type Shared struct {
	name string
	size int

	mu     sync.Mutex
	fd     int
	b      []byte
	closed bool
}

// NewShared creates a memfd called name (close-on-exec) of size bytes and
// maps it read-write and shared. The memory reads as zeros; its pages are
// allocated when first touched (an engine's 1 GiB cache costs nothing until
// it is used).
func NewShared(name string, size int) (*Shared, error) {
	if size <= 0 {
		return nil, fmt.Errorf("hostmem: shared memory %q of %d B: size must be > 0", name, size)
	}
	fd, b, err := memfdMap(name, size, false)
	if err != nil {
		return nil, fmt.Errorf("hostmem: %w", err)
	}
	return &Shared{name: name, size: size, fd: fd, b: b}, nil
}

// Bytes returns the mapping (nil after Close). Its address is stable.
func (s *Shared) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b
}

// FD returns the memfd (-1 after Close). It stays owned by s.
func (s *Shared) FD() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fd
}

// Size returns the size in bytes (as given to NewShared).
func (s *Shared) Size() int { return s.size }

// Name returns the memfd's name.
func (s *Shared) Name() string { return s.name }

// Handle describes the memory for Import (device.HandleMemfd). The fd in it
// stays owned by s.
func (s *Shared) Handle() device.Handle {
	s.mu.Lock()
	defer s.mu.Unlock()
	return device.Handle{Kind: device.HandleMemfd, FD: s.fd, Size: uint64(s.size)}
}

// Close unmaps the memory and closes the fd. Mappings imported from it stay
// valid (the pages live until the last mapping goes). A second Close returns
// an error wrapping device.ErrClosed.
func (s *Shared) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("hostmem: close shared memory %q: %w", s.name, device.ErrClosed)
	}
	s.closed = true
	err := errors.Join(munmap(s.b), closeFD(s.fd))
	s.b, s.fd = nil, -1
	if err != nil {
		return fmt.Errorf("hostmem: close shared memory %q: %w", s.name, err)
	}
	return nil
}
