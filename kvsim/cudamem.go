package kvsim

import (
	"fmt"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/cuda"
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/wire"
)

// CUDAMemory is device memory of a CUDA GPU, shared with the sidecar by a
// legacy IPC handle. The cache's window sits at a non-zero offset inside a
// larger allocation (Slack bytes before and after), so registration must
// carry the sub-allocation offset for the right bytes to move.
type CUDAMemory struct {
	dev    *cuda.Device
	base   device.Addr // the allocation
	addr   device.Addr // what the cache uses: base + slack
	size   uint64
	handle [64]byte
	hoff   uint64 // addr's offset inside the allocation the handle names
	asize  uint64
}

// Slack is the extra device memory around a CUDAMemory.
const Slack = 1 << 20

// NewCUDAMemory allocates size bytes (plus slack on both sides) on dev.
func NewCUDAMemory(dev *cuda.Device, size uint64) (*CUDAMemory, error) {
	base, err := dev.AllocDevice(size + 2*Slack)
	if err != nil {
		return nil, err
	}
	m := &CUDAMemory{dev: dev, base: base, addr: base + Slack + 256 + 16, size: size}
	// An odd offset (not a multiple of the page or even of 256) checks that
	// every layer carries the offset through registration.
	x, err := dev.Export(m.addr)
	if err != nil {
		_ = dev.FreeDevice(base)
		return nil, err
	}
	copy(m.handle[:], x.Handle.Bytes)
	m.hoff, m.asize = x.Offset, x.Handle.Size
	return m, nil
}

func (m *CUDAMemory) Size() uint64 { return m.size }
func (m *CUDAMemory) Host() []byte { return nil }
func (m *CUDAMemory) Close() error { return m.dev.FreeDevice(m.base) }

// Addr is the device address of the cache's first byte.
func (m *CUDAMemory) Addr() device.Addr { return m.addr }

func (m *CUDAMemory) Region(name string, off, length uint64, access wire.Access) client.Region {
	return client.Region{Name: name, Handle: uint8(device.HandleCUDAIPC), Access: access, Ordinal: uint32(m.dev.Ordinal()),
		AllocSize: m.asize, Offset: m.hoff + off, Length: length, HandleRaw: m.handle[:], FD: -1}
}

func (m *CUDAMemory) WriteAt(p []byte, off uint64) error {
	if off+uint64(len(p)) > m.size {
		return fmt.Errorf("kvsim: write of %d B at %d past %d B", len(p), off, m.size)
	}
	return m.dev.CopyHtoD(m.addr+device.Addr(off), p)
}

func (m *CUDAMemory) ReadAt(p []byte, off uint64) error {
	if off+uint64(len(p)) > m.size {
		return fmt.Errorf("kvsim: read of %d B at %d past %d B", len(p), off, m.size)
	}
	return m.dev.CopyDtoH(p, m.addr+device.Addr(off))
}
