package hostmem

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/stage-kv/stage/device"
)

// ErrFault is a copy that touched memory which was no longer there: a
// page of an imported memfd its owner truncated (SIGBUS), or an address
// unmapped under the copy (SIGSEGV). The copy fails; the process lives.
var ErrFault = errors.New("memory fault during copy")

// faultAddr is what a runtime.Error from a fault at a non-nil address
// also has (runtime/debug.SetPanicOnFault).
type faultAddr interface{ Addr() uintptr }

// copyGuarded copies between host and the memory of segs, in kind's
// direction, and turns a fault in that memory into an error wrapping
// ErrFault. Memory imported from another process can vanish under a copy
// (its owner truncates the file); without the guard the runtime would
// kill the whole sidecar for it. Any other panic goes on up.
func copyGuarded(kind opKind, host []byte, segs []device.Seg) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	off := 0
	defer func() {
		if r := recover(); r != nil {
			err = faultError(r, fmt.Sprintf("%s of %d B in %d segments, at byte %d", kind, len(host), len(segs), off))
		}
	}()
	for _, sg := range segs {
		mem := bytesAt(sg.Addr, sg.Len) // see bytesAt for why this is safe
		if kind == opGather {
			off += copy(host[off:], mem)
		} else {
			off += copy(mem, host[off:])
		}
	}
	return nil
}

// copyDtoDGuarded is copy(dst, src) with copyGuarded's fault guard.
func copyDtoDGuarded(dst, src []byte) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = faultError(r, fmt.Sprintf("dtod of %d B %#x -> %#x", len(dst), addrOf(src), addrOf(dst)))
		}
	}()
	copy(dst, src)
	return nil
}

// faultError is the error for a recovered fault r; r being any other
// panic, it panics again with it.
func faultError(r any, what string) error {
	re, ok := r.(runtime.Error)
	fa, isFault := r.(faultAddr)
	if !ok || !isFault {
		panic(r)
	}
	return fmt.Errorf("%s: %w at address %#x (%v); was the memory's file truncated or unmapped by its owner?", what, ErrFault, fa.Addr(), re)
}
