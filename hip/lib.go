package hip

/*
#cgo CFLAGS: -O2 -Wall
#include "shim.h"
*/
import "C"

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/stage-kv/stage/internal/dl"
)

// DefaultLibraryName is the runtime opened when device.hip.library
// (Config.Library) names no other. ROCm puts it in /opt/rocm/lib, which its
// ld.so.conf entry or LD_LIBRARY_PATH makes visible.
const DefaultLibraryName = "libamdhip64.so"

// Library is libamdhip64 opened with dlopen, every entry point resolved once
// at open into a field of a C struct (shim.h lists each with its C
// prototype). A Library is safe for concurrent use and is shared by the
// Devices opened from it.
type Library struct {
	*dl.Lib // Path, Absent, AbsentList
	c       *C.sthip_hip

	initOnce sync.Once
	initErr  error
}

// OpenLibrary opens the HIP runtime at path ("" means DefaultLibraryName)
// and resolves every symbol stage uses. A missing required symbol fails the
// open with one error naming the library and every missing symbol; missing
// optional ones are recorded in Absent with what each costs.
func OpenLibrary(path string) (*Library, error) {
	path = cmp.Or(path, DefaultLibraryName)
	c := C.sthip_hip_new()
	if c == nil {
		return nil, fmt.Errorf("hip: %s: out of memory for the symbol table", path)
	}
	lib, err := dl.Load(path, dl.Binding{
		Lib:     "hip",
		Install: "is ROCm installed (libamdhip64.so on the loader path, e.g. /opt/rocm/lib) or device.hip.library set?",
		TooOld:  "ROCm too old, or not libamdhip64?",
		Table:   symbols(),
		Set:     func(i int, p unsafe.Pointer) { C.sthip_sym_set(c, C.int(i), p) },
		Absent:  absentReason,
	})
	if err != nil {
		C.sthip_hip_free(c)
		return nil, err
	}
	return &Library{Lib: lib, c: c}, nil
}

func absentReason(_ int, name string) string {
	if name == "hipDeviceEnablePeerAccess" {
		return "EnablePeerAccess unavailable; IPC imports still enable it lazily (hipIpcMemLazyEnablePeerAccess)"
	}
	return "unused"
}

var libs dl.Cache[*Library]

// SharedLibrary returns the process-wide library for path ("" means
// DefaultLibraryName), opening it on first use. A failed open is not
// remembered: a later call tries again. Libraries opened here are never
// closed.
func SharedLibrary(path string) (*Library, error) {
	return libs.Get(cmp.Or(path, DefaultLibraryName), OpenLibrary)
}

// Close unloads a library that no open Device uses. Libraries from
// SharedLibrary must not be closed.
func (l *Library) Close() error {
	libs.Forget(l)
	if l.c != nil {
		C.sthip_hip_free(l.c)
		l.c = nil
	}
	return l.Lib.Close()
}

// init calls hipInit(0) once per Library. The runtime also initializes
// itself on first use; the explicit call makes a broken install fail at
// open, with its own error.
func (l *Library) init() error {
	l.initOnce.Do(func() {
		l.initErr = l.check(C.sthip_init(l.c), "hipInit(0)")
	})
	return l.initErr
}

// check turns a trampoline's result into nil or an *Error; format is
// formatted only on the error path.
func (l *Library) check(r C.sthip_ret, format string, args ...any) error {
	if r.rc == 0 {
		return nil
	}
	e := &Error{Op: format, Code: int(r.rc)}
	if len(args) > 0 {
		e.Op = fmt.Sprintf(format, args...)
	}
	if r.name != nil {
		e.Name = C.GoString(r.name)
	}
	if e.Name == "" {
		e.Name = "hipError_t(" + strconv.Itoa(e.Code) + ")"
	}
	if r.msg != nil {
		e.Msg = strings.TrimSpace(C.GoString(r.msg))
	}
	return e
}

// symbols lists every export the Library resolves, in table order, with
// its group (dl.Required or optional).
func symbols() []dl.Sym {
	n := int(C.sthip_nsyms())
	out := make([]dl.Sym, n)
	for i := range out {
		out[i] = dl.Sym{Name: C.GoString(C.sthip_sym_name(C.int(i))), Group: int(C.sthip_sym_group(C.int(i)))}
	}
	return out
}
