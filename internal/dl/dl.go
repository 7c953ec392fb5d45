// Package dl is the vendor backends' door to the dynamic loader (cuda, acl,
// hip): open a shared library at run time, bind its symbol table, unload
// it, and the one shape their errors take. Load (lib.go) is a backend's
// whole open: dlopen, every symbol bound, required ones missing reported in
// one error naming the file and each symbol, optional ones recorded with
// what their absence costs. The C side of a binding (the struct of function
// pointers, the trampolines) stays in the backend's cgo shim.
//
// dlerror's text lives in a per-thread buffer that the next loader call on
// that thread overwrites, and a goroutine may move to another OS thread
// between two cgo calls. So every call here runs the loader function and
// reads dlerror in one C call, copying the text before returning: a loader
// error is never lost or swapped for another thread's.
package dl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// dl_ret is a loader call's result and, when it failed, a malloc'd copy of
// dlerror's text (NULL when the loader gave none).
typedef struct { void *p; char *err; } dl_ret;

static char *dl_take_error(void) {
	const char *e = dlerror();
	return e ? strdup(e) : NULL;
}

static dl_ret dl_open(const char *path, int flags) {
	dl_ret r = {0, 0};
	dlerror();
	r.p = dlopen(path, flags);
	if (r.p == NULL) r.err = dl_take_error();
	return r;
}

static dl_ret dl_sym(void *h, const char *name) {
	dl_ret r = {0, 0};
	dlerror();
	r.p = dlsym(h, name);
	if (r.p == NULL) r.err = dl_take_error();
	return r;
}

static char *dl_close(void *h) {
	dlerror();
	return dlclose(h) != 0 ? dl_take_error() : NULL;
}

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

// takeError turns a C string from the shim into Go text and frees it.
func takeError(e *C.char, fallback string) string {
	if e == nil {
		return fallback
	}
	defer C.free(unsafe.Pointer(e))
	return C.GoString(e)
}

// Open loads path (a bare name is searched the way dlopen searches) with
// RTLD_NOW|RTLD_LOCAL: every undefined symbol of the library is bound now,
// so a broken install fails here and not in the middle of a copy. The
// error reads "dlopen PATH: <dlerror's text>".
func Open(path string) (*Handle, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	r := C.dl_open(cs, C.RTLD_NOW|C.RTLD_LOCAL)
	if r.p == nil {
		return nil, fmt.Errorf("dlopen %s: %s", path, takeError(r.err, "dlopen failed"))
	}
	return &Handle{path: path, h: r.p}, nil
}

// Path is the path given to Open.
func (h *Handle) Path() string { return h.path }

// Lookup returns the address of name, or nil when the library lacks it.
func (h *Handle) Lookup(name string) unsafe.Pointer {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	r := C.dl_sym(h.h, cs)
	if r.err != nil {
		C.free(unsafe.Pointer(r.err))
	}
	return r.p
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
	if e := C.dl_close(h.h); e != nil {
		return errors.New("dlclose " + h.path + ": " + takeError(e, ""))
	}
	h.h = nil
	return nil
}
