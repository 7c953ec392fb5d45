// Package dl opens a shared library at run time and looks up its symbols
// (dlopen, dlsym, dlclose). It is the only code of the cuda backend that
// talks to the dynamic loader; errors carry the loader's own text.
package dl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

static const char *stage_dlerror(void) { return dlerror(); }
static long stage_call_long(void *fp) { return ((long (*)(void))fp)(); }
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

// Open loads the library at path (a file name searched like dlopen does, or
// a path) with RTLD_NOW|RTLD_LOCAL. The error is dlerror's text.
func Open(path string) (*Handle, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	C.stage_dlerror() // clear any stale error
	h := C.dlopen(cs, C.RTLD_NOW|C.RTLD_LOCAL)
	if h == nil {
		return nil, errors.New(lastError("dlopen failed"))
	}
	return &Handle{path: path, h: h}, nil
}

// Path returns the path the library was opened with.
func (h *Handle) Path() string { return h.path }

// Lookup returns the address of symbol name, or nil when the library does
// not export it.
func (h *Handle) Lookup(name string) unsafe.Pointer {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	C.stage_dlerror()
	return C.dlsym(h.h, cs)
}

// CallLong calls the exported C function `long name(void)`; tests use it to
// read counters of fake libraries.
func (h *Handle) CallLong(name string) (int64, error) {
	p := h.Lookup(name)
	if p == nil {
		return 0, fmt.Errorf("%s: no symbol %s", h.path, name)
	}
	return int64(C.stage_call_long(p)), nil
}

// Close unloads the library. Nothing it exported may be called afterwards.
func (h *Handle) Close() error {
	if h.h == nil {
		return nil
	}
	C.stage_dlerror()
	if C.dlclose(h.h) != 0 {
		return errors.New(lastError("dlclose failed"))
	}
	h.h = nil
	return nil
}

func lastError(fallback string) string {
	if e := C.stage_dlerror(); e != nil {
		return C.GoString(e)
	}
	return fallback
}
