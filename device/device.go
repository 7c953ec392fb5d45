package device

import (
	"errors"
	"fmt"
)

// Kind names a backend.
type Kind string

// The backends stage knows.
const (
	KindHostmem Kind = "hostmem"
	KindCUDA    Kind = "cuda"
	KindACL     Kind = "acl"
	KindHIP     Kind = "hip"
)

// Addr is an address in a device's address space: a CUdeviceptr, an ACL or
// HIP device pointer, or, for hostmem, an address in this process. Go code
// outside a backend never dereferences it.
type Addr uint64

// Seg is a range of device memory.
type Seg struct {
	Addr Addr
	Len  uint64
}

// Pinned is page-locked host memory with two views of the same pages: Host for
// syscalls and CPU code, DeviceAddr for kernels and copy engines. Plain host
// memory has no device view, so a []byte cannot stand in for a Pinned.
type Pinned struct {
	host []byte
	dev  Addr
}

// NewPinned is for backends: it wraps pages they pinned.
func NewPinned(host []byte, dev Addr) Pinned { return Pinned{host: host, dev: dev} }

// Host returns the host view.
func (p Pinned) Host() []byte { return p.host }

// DeviceAddr returns the device view of Host()[0] (0 when the backend has none).
func (p Pinned) DeviceAddr() Addr { return p.dev }

// Len returns the length in bytes.
func (p Pinned) Len() int { return len(p.host) }

// Slice returns the sub-buffer [off, off+n) with both views moved alike.
// It panics on a range outside p, like slicing does: callers compute ranges
// from their own slot sizes, never from peer input.
func (p Pinned) Slice(off, n int) Pinned {
	h := p.host[off : off+n : off+n]
	var d Addr
	if p.dev != 0 {
		d = p.dev + Addr(off)
	}
	return Pinned{host: h, dev: d}
}

// HandleKind says how an engine shared an allocation with its sidecar.
type HandleKind uint8

// Handle kinds. The values travel on the control socket (see wire).
const (
	HandleNone     HandleKind = 0
	HandleMemfd    HandleKind = 1 // hostmem: a memfd passed with SCM_RIGHTS
	HandleCUDAIPC  HandleKind = 2 // CUDA legacy IPC handle (64 bytes)
	HandlePosixFD  HandleKind = 3 // VMM allocation exported as a POSIX fd (SCM_RIGHTS)
	HandleACLKey   HandleKind = 4 // Ascend IPC export key
	HandleHIPIPC   HandleKind = 5 // HIP IPC handle (64 bytes)
	HandleHostAddr HandleKind = 6 // memory of the sidecar's own process (tests, benchmarks)
	HandleACLVMM   HandleKind = 7 // Ascend VMM chunks, each exported as a shareable handle (acl.VMMHandle)
)

func (k HandleKind) String() string {
	switch k {
	case HandleMemfd:
		return "memfd"
	case HandleCUDAIPC:
		return "cuda-ipc"
	case HandlePosixFD:
		return "posix-fd"
	case HandleACLKey:
		return "acl-key"
	case HandleHIPIPC:
		return "hip-ipc"
	case HandleHostAddr:
		return "host-addr"
	case HandleACLVMM:
		return "acl-vmm"
	}
	return fmt.Sprintf("handle(%d)", uint8(k))
}

// Handle describes an allocation shared by an engine process. Import reads
// it; FD stays owned by the caller (Import dups what it keeps).
type Handle struct {
	Kind  HandleKind
	Bytes []byte // IPC handle or export key
	FD    int    // memfd or POSIX fd; -1 when none
	Size  uint64 // size of the whole allocation
	Addr  Addr   // HandleHostAddr only
}

// Mapping is an allocation imported into this process.
type Mapping interface {
	// Base is the address of the allocation's first byte in this process.
	Base() Addr
	// Size is the allocation's size in bytes.
	Size() uint64
	// Close unmaps it. The caller must have no copy in flight on it.
	Close() error
}

// Device is one accelerator (or its emulation) opened by the sidecar.
type Device interface {
	Kind() Kind
	Ordinal() int
	// String names the device for logs and errors, e.g. "cuda:0".
	String() string
	// AllocPinned allocates n bytes of page-locked host memory with a device view.
	AllocPinned(n int) (Pinned, error)
	// FreePinned frees what AllocPinned returned (the whole buffer, not a slice).
	FreePinned(p Pinned) error
	// Import maps an allocation shared by an engine process.
	Import(h Handle) (Mapping, error)
	// NewStream creates an asynchronous copy stream.
	NewStream() (Stream, error)
	// NewEvent creates an event to record on a stream.
	NewEvent() (Event, error)
	// Close releases the device. Streams, events, pinned buffers and mappings
	// must have been closed first; Close reports any that were not.
	Close() error
}

// Stream runs copies in the order they were enqueued, asynchronously to the
// caller. Enqueue errors are returned at once; errors of the copy itself
// arrive through the next event recorded after it.
type Stream interface {
	// Gather enqueues a copy of segs, in order, into dst contiguously
	// (device to host). The segment lengths must add up to dst.Len();
	// segments of length 0 are skipped.
	Gather(dst Pinned, segs []Seg) error
	// Scatter enqueues a copy of src, contiguously, into segs (host to
	// device). The segment lengths must add up to src.Len().
	Scatter(segs []Seg, src Pinned) error
	// Record enqueues ev: it completes when all work enqueued before it has.
	Record(ev Event) error
	// Synchronize waits for all enqueued work and returns its first error.
	Synchronize() error
	Close() error
}

// SyncCopier is implemented by devices that can move a small buffer on the
// calling goroutine, with no stream, event or hand-off: the latency path
// for transfers that fit in one small slot. Callers use it for a few KiB;
// a device without it is driven through a stream and an event instead.
type SyncCopier interface {
	// GatherSync copies segs, in order, into dst (device to host) and
	// returns when the bytes are there.
	GatherSync(dst Pinned, segs []Seg) error
	// ScatterSync copies src into segs (host to device) and returns when
	// the bytes are there.
	ScatterSync(segs []Seg, src Pinned) error
}

// Event marks a point in a stream. It may be recorded again once complete.
type Event interface {
	// Query reports whether the work before the event is done, and that
	// work's error if it failed.
	Query() (done bool, err error)
	// Wait blocks until the work before the event is done and returns its error.
	Wait() error
	Close() error
}

// Sentinel errors; backends wrap them so callers can use errors.Is.
var (
	ErrOutOfMemory  = errors.New("out of memory")
	ErrNotSupported = errors.New("not supported")
	ErrNotReady     = errors.New("not ready")
	ErrClosed       = errors.New("closed")
	ErrBadHandle    = errors.New("bad handle")
)

// SegsLen adds up the lengths of segs.
func SegsLen(segs []Seg) uint64 {
	var n uint64
	for _, s := range segs {
		n += s.Len
	}
	return n
}
