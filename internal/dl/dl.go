// Package dl is the vendor backends' door to the dynamic loader (cuda, acl,
// hip): open a shared library at run time, look up symbols, unload it.
// Errors carry dlerror's own text, so a missing file or an unresolved
// dependency reads as the loader said it.
package dl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

static const char *dl_error(void) { return dlerror(); }
static long dl_call0(void *fp) { return ((long (*)(void))fp)(); }
static long dl_call1(void *fp, long a) { return ((long (*)(long))fp)(a); }
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Handle is an open library.
type Handle struct {
	path string
	h    unsafe.Pointer
}

// Open loads path (a bare name is searched the way dlopen searches) with
// RTLD_NOW|RTLD_LOCAL: every undefined symbol of the library is bound now,
// so a broken install fails here and not in the middle of a copy.
func Open(path string) (*Handle, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	C.dl_error() // drop a stale message
	h := C.dlopen(cs, C.RTLD_NOW|C.RTLD_LOCAL)
	if h == nil {
		return nil, errors.New(loaderError("dlopen failed"))
	}
	return &Handle{path: path, h: h}, nil
}

// Path is the path given to Open.
func (h *Handle) Path() string { return h.path }

// Lookup returns the address of name, or nil when the library lacks it.
func (h *Handle) Lookup(name string) unsafe.Pointer {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	C.dl_error()
	return C.dlsym(h.h, cs)
}

// Call calls `long name(void)`, or `long name(long)` when an argument is
// given. Tests use it to read the counters and turn the knobs of the
// emulation libraries; nothing on stage's data path calls it.
func (h *Handle) Call(name string, arg ...int64) (int64, error) {
	p := h.Lookup(name)
	if p == nil {
		return 0, fmt.Errorf("%s: no symbol %s", h.path, name)
	}
	switch len(arg) {
	case 0:
		return int64(C.dl_call0(p)), nil
	case 1:
		return int64(C.dl_call1(p, C.long(arg[0]))), nil
	}
	return 0, fmt.Errorf("%s: %s: at most one argument", h.path, name)
}

// Close unloads the library; nothing it exported may be called afterwards.
func (h *Handle) Close() error {
	if h.h == nil {
		return nil
	}
	C.dl_error()
	if C.dlclose(h.h) != 0 {
		return errors.New(loaderError("dlclose failed"))
	}
	h.h = nil
	return nil
}

func loaderError(fallback string) string {
	if e := C.dl_error(); e != nil {
		return C.GoString(e)
	}
	return fallback
}
