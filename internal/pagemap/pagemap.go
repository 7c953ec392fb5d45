// Package pagemap maps anonymous host memory for pinned slots and gives a
// range of it fresh pages in place. Backends use it for slots written with
// vmsplice+splice (device.SlotRenewer): the kernel may still hold the old
// pages in socket buffers, so a slot is renewed rather than rewritten.
//
// It never pins memory (the backend registers what it maps) and never
// frees a range it did not map.
package pagemap

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	prot     = unix.PROT_READ | unix.PROT_WRITE
	anon     = unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_POPULATE
	anonName = "MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE"
)

// ErrUnaligned is wrapped by the errors of sizes and addresses that are not
// whole pages.
var ErrUnaligned = errors.New("not a whole number of pages")

// Map maps n bytes (a multiple of the page size) of private anonymous
// memory, prefaulted so that the first copy into it pays for no page fault.
func Map(n int) ([]byte, error) {
	if n <= 0 || n%os.Getpagesize() != 0 {
		return nil, fmt.Errorf("map %d B of anonymous memory: %w (page size %d)", n, ErrUnaligned, os.Getpagesize())
	}
	b, err := unix.Mmap(-1, 0, n, prot, anon)
	if err != nil {
		return nil, fmt.Errorf("mmap(%d B, PROT_READ|PROT_WRITE, %s): %w", n, anonName, err)
	}
	return b, nil
}

// Unmap unmaps what Map returned (all of it).
func Unmap(b []byte) error {
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("munmap(%#x, %d B): %w", Addr(b), len(b), err)
	}
	return nil
}

// Renew replaces the pages under b, a page-aligned part of a Map mapping,
// with fresh zeroed ones at the same address (mmap MAP_FIXED). Whoever
// still references the old pages (a pipe, a socket buffer) keeps them;
// the kernel frees them when the last reference goes. b must not be
// pinned by a device runtime while this runs.
func Renew(b []byte) error {
	a, pg := Addr(b), uintptr(os.Getpagesize())
	if len(b) == 0 || a%pg != 0 || uintptr(len(b))%pg != 0 {
		return fmt.Errorf("renew %d B at %#x: %w (page size %d)", len(b), a, ErrUnaligned, pg)
	}
	r, _, errno := unix.Syscall6(unix.SYS_MMAP, a, uintptr(len(b)), prot, anon|unix.MAP_FIXED, ^uintptr(0), 0)
	if errno != 0 {
		return fmt.Errorf("mmap(%#x, %d B, PROT_READ|PROT_WRITE, MAP_FIXED|%s): %w", a, len(b), anonName, errno)
	}
	if r != a { // MAP_FIXED maps there or fails; never elsewhere
		return fmt.Errorf("mmap(%#x, %d B, MAP_FIXED) mapped at %#x", a, len(b), r)
	}
	return nil
}

// Addr is the address of b's first byte (0 when b has no capacity).
func Addr(b []byte) uintptr {
	if cap(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}
