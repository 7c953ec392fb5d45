package hostmem

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/devicetest"
)

// procMemory is devicetest.Memory for hostmem, whose device addresses are
// this process's: anonymous mappings, outside the Go heap.
type procMemory struct {
	mu   sync.Mutex
	maps map[device.Addr][]byte
}

func (m *procMemory) AllocDevice(n uint64) (device.Addr, error) {
	b, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		return 0, fmt.Errorf("mmap %d B: %w", n, err)
	}
	a := device.Addr(uintptr(unsafe.Pointer(&b[0])))
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.maps == nil {
		m.maps = map[device.Addr][]byte{}
	}
	m.maps[a] = b
	return a, nil
}

func (m *procMemory) FreeDevice(a device.Addr) error {
	m.mu.Lock()
	b, ok := m.maps[a]
	delete(m.maps, a)
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("%#x: not allocated here", uint64(a))
	}
	return syscall.Munmap(b)
}

// at returns the n bytes at a, inside one of the mappings.
func (m *procMemory) at(a device.Addr, n int) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for base, b := range m.maps {
		if a >= base && uint64(a-base)+uint64(n) <= uint64(len(b)) {
			off := int(a - base)
			return b[off : off+n], nil
		}
	}
	return nil, fmt.Errorf("%d B at %#x: outside every allocation", n, uint64(a))
}

func (m *procMemory) CopyHtoD(dst device.Addr, src []byte) error {
	b, err := m.at(dst, len(src))
	copy(b, src)
	return err
}

func (m *procMemory) CopyDtoH(dst []byte, src device.Addr) error {
	b, err := m.at(src, len(dst))
	copy(dst, b)
	return err
}

func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Config
	}{
		{"memmove", Config{}},
		{"modeled", Config{BandwidthBytesPerSec: 20e9, Latency: 2000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devicetest.Run(t, newDev(t, tc.opts), &procMemory{}, devicetest.Options{})
		})
	}
}
