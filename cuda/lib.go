package cuda

/*
#cgo CFLAGS: -O2 -Wall
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"cmp"
	"fmt"
	"sync"
	"unsafe"

	"github.com/stage-kv/stage/internal/dl"
)

// DefaultLibraryName is the driver library opened when device.cuda.library
// (Config.Library) names no other.
const DefaultLibraryName = "libcuda.so.1"

// Symbol groups of the bound table (stage_sym_optional in shim.c).
const (
	symBatch = 1 // cuMemcpyBatchAsync (either ABI)
	symVMM   = 2 // VMM import/export
)

// Library is libcuda opened with dlopen, every entry point resolved once at
// open into a field of a C struct (shim.h lists each with its C prototype).
// A Library is safe for concurrent use and is shared by the Devices opened
// from it.
type Library struct {
	*dl.Lib // Path, Absent, AbsentList
	c       *C.stage_cu

	batch  bool // cuMemcpyBatchAsync_v2 or cuMemcpyBatchAsync
	vmm    bool // every VMM call present
	vmmWhy string

	initOnce sync.Once
	initErr  error
}

// OpenLibrary opens the CUDA driver library at path ("" means
// DefaultLibraryName) and resolves every symbol stage uses. A missing
// required symbol fails the open with one error that lists them all;
// missing optional ones (batched copies, VMM) are recorded in Absent.
func OpenLibrary(path string) (*Library, error) {
	path = cmp.Or(path, DefaultLibraryName)
	c := C.stage_cu_new()
	if c == nil {
		return nil, fmt.Errorf("cuda: %s: out of memory for the symbol table", path)
	}
	lib, err := dl.Load(path, dl.Binding{
		Lib:     "cuda",
		Install: "is the NVIDIA driver installed and visible in this container (or device.cuda.library set)?",
		TooOld:  "driver too old?",
		Table:   symbols(),
		Set:     func(i int, p unsafe.Pointer) { C.stage_sym_set(c, C.int(i), p) },
		Absent:  absentReason,
	})
	if err != nil {
		C.stage_cu_free(c)
		return nil, err
	}
	l := &Library{Lib: lib, c: c}
	l.batch = c.cuMemcpyBatchAsync_v2 != nil || c.cuMemcpyBatchAsync != nil
	l.vmm = len(lib.Missing(symVMM)) == 0
	if !l.vmm {
		l.vmmWhy = fmt.Sprintf("%s lacks %d VMM entry points", path, len(lib.Missing(symVMM)))
	}
	return l, nil
}

func absentReason(group int, name string) string {
	if group == symVMM {
		return "VMM import/export (POSIX fd handles) unavailable; needs a CUDA 10.2+ driver"
	}
	return batchAbsentReason(name)
}

func batchAbsentReason(name string) string {
	if name == "cuMemcpyBatchAsync_v2" {
		return "CUDA 13 batched copies absent (driver older than 13.0); using cuMemcpyBatchAsync if present"
	}
	return "CUDA 12.8 batched copies absent (driver older than 12.8); batch copy mode needs cuMemcpyBatchAsync_v2"
}

var libs dl.Cache[*Library]

// SharedLibrary returns the process-wide library for path ("" means
// DefaultLibraryName), opening it on first use. A failed open is not
// remembered: a later call tries again. Libraries opened here are never
// closed (drivers do not like dlclose).
func SharedLibrary(path string) (*Library, error) {
	return libs.Get(cmp.Or(path, DefaultLibraryName), OpenLibrary)
}

// HasBatchCopy reports whether cuMemcpyBatchAsync (either ABI) is exported.
func (l *Library) HasBatchCopy() bool { return l.batch }

// HasVMM reports whether the VMM calls (POSIX fd import/export) are exported.
func (l *Library) HasVMM() bool { return l.vmm }

// DriverVersion returns cuDriverGetVersion's value (e.g. 13000 for 13.0).
func (l *Library) DriverVersion() (int, error) {
	var v C.int
	if rc := C.stage_driver_version(l.c, &v); rc != 0 {
		return 0, l.check(rc, "cuDriverGetVersion")
	}
	return int(v), nil
}

// Close unloads a library that no open Device uses. Libraries from
// SharedLibrary must not be closed.
func (l *Library) Close() error {
	libs.Forget(l)
	if l.c != nil {
		C.stage_cu_free(l.c)
		l.c = nil
	}
	return l.Lib.Close()
}

func (l *Library) init() error {
	l.initOnce.Do(func() {
		if rc := C.stage_init(l.c); rc != 0 {
			l.initErr = l.check(rc, "cuInit")
		}
	})
	return l.initErr
}

// check turns a driver call's result into nil or an *Error; op is
// formatted only on the error path.
func (l *Library) check(rc C.CUresult, format string, args ...any) error {
	if rc == 0 {
		return nil
	}
	code := int(rc)
	e := &Error{Op: format, Code: code}
	if len(args) > 0 {
		e.Op = fmt.Sprintf(format, args...)
	}
	if s := C.stage_error_name(l.c, rc); s != nil {
		e.Name = C.GoString(s)
	} else {
		e.Name = fmt.Sprintf("CUresult(%d)", code)
	}
	if s := C.stage_error_string(l.c, rc); s != nil {
		e.Msg = C.GoString(s)
	}
	return e
}

// symbols lists every export the Library resolves, in table order, with
// its group (dl.Required, symBatch, symVMM).
func symbols() []dl.Sym {
	n := int(C.stage_nsyms())
	out := make([]dl.Sym, n)
	for i := range out {
		out[i] = dl.Sym{Name: C.GoString(C.stage_sym_name(C.int(i))), Group: int(C.stage_sym_optional(C.int(i)))}
	}
	return out
}
