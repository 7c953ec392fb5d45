package cuda

/*
#cgo CFLAGS: -O2 -Wall
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/stage-kv/stage/internal/dl"
)

// DefaultLibraryName is the driver library opened when neither a path nor
// $STAGE_CUDA_LIBRARY names another.
const DefaultLibraryName = "libcuda.so.1"

// Library is libcuda opened with dlopen, every entry point resolved once at
// open into a field of a C struct (shim.h lists each with its C prototype).
// A Library is safe for concurrent use and is shared by the Devices opened
// from it.
type Library struct {
	path   string
	h      *dl.Handle
	c      *C.stage_cu
	absent map[string]string // optional export -> why it matters

	batch  bool // cuMemcpyBatchAsync_v2 or cuMemcpyBatchAsync
	vmm    bool // every VMM call present
	vmmWhy string

	initOnce sync.Once
	initErr  error
}

// OpenLibrary opens the CUDA driver library at path ("" means
// $STAGE_CUDA_LIBRARY, or libcuda.so.1 when that is unset) and resolves every
// symbol stage uses. A missing required symbol fails the open with one error
// that lists them all; missing optional ones (batched copies, VMM) are
// recorded in Absent.
func OpenLibrary(path string) (*Library, error) {
	path = libraryPath(path)
	h, err := dl.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cuda: dlopen %s: %v; is the NVIDIA driver installed and visible in this container?", path, err)
	}
	c := C.stage_cu_new()
	if c == nil {
		h.Close()
		return nil, fmt.Errorf("cuda: %s: out of memory for the symbol table", path)
	}
	l := &Library{path: path, h: h, c: c, absent: map[string]string{}}
	var missing []string
	vmmMissing := 0
	for i := 0; i < int(C.stage_nsyms()); i++ {
		name := C.GoString(C.stage_sym_name(C.int(i)))
		opt := int(C.stage_sym_optional(C.int(i)))
		p := h.Lookup(name)
		if p == nil {
			switch opt {
			case 0:
				missing = append(missing, name)
			case 1:
				l.absent[name] = batchAbsentReason(name)
			default:
				vmmMissing++
				l.absent[name] = "VMM import/export (POSIX fd handles) unavailable; needs a CUDA 10.2+ driver"
			}
			continue
		}
		C.stage_sym_set(c, C.int(i), p)
	}
	if len(missing) > 0 {
		C.stage_cu_free(c)
		h.Close()
		return nil, fmt.Errorf("cuda: %s: missing %s; driver too old?", path, strings.Join(missing, ", "))
	}
	l.batch = c.cuMemcpyBatchAsync_v2 != nil || c.cuMemcpyBatchAsync != nil
	l.vmm = vmmMissing == 0
	if !l.vmm {
		l.vmmWhy = fmt.Sprintf("%s lacks %d VMM entry points", path, vmmMissing)
	}
	return l, nil
}

func libraryPath(path string) string {
	if path != "" {
		return path
	}
	if p := os.Getenv("STAGE_CUDA_LIBRARY"); p != "" {
		return p
	}
	return DefaultLibraryName
}

func batchAbsentReason(name string) string {
	if name == "cuMemcpyBatchAsync_v2" {
		return "CUDA 13 batched copies absent (driver older than 13.0); using cuMemcpyBatchAsync if present"
	}
	return "CUDA 12.8 batched copies absent (driver older than 12.8); batch copy mode needs cuMemcpyBatchAsync_v2"
}

var libs dl.Cache[*Library]

// DefaultLibrary returns the process-wide library for $STAGE_CUDA_LIBRARY
// (or libcuda.so.1), opening it on first use. A failed open is not
// remembered: a later call tries again. Libraries opened here are never
// closed (drivers do not like dlclose).
func DefaultLibrary() (*Library, error) {
	return libs.Get(libraryPath(""), OpenLibrary)
}

// Path returns the path the library was opened with.
func (l *Library) Path() string { return l.path }

// Absent maps each optional export the library lacks to what that costs.
func (l *Library) Absent() map[string]string {
	m := make(map[string]string, len(l.absent))
	for k, v := range l.absent {
		m[k] = v
	}
	return m
}

// AbsentList renders Absent sorted, one "name: reason" per entry.
func (l *Library) AbsentList() []string {
	out := make([]string, 0, len(l.absent))
	for k, v := range l.absent {
		out = append(out, k+": "+v)
	}
	sort.Strings(out)
	return out
}

// HasBatchCopy reports whether cuMemcpyBatchAsync (either ABI) is exported.
func (l *Library) HasBatchCopy() bool { return l.batch }

// HasVMM reports whether the VMM calls (POSIX fd import/export) are exported.
func (l *Library) HasVMM() bool { return l.vmm }

// DriverVersion returns cuDriverGetVersion's value (e.g. 13000 for 13.0).
func (l *Library) DriverVersion() (int, error) {
	var v C.int
	if rc := C.stage_driver_version(l.c, &v); rc != 0 {
		return 0, l.errorf(rc, "cuDriverGetVersion")
	}
	return int(v), nil
}

// Close unloads a library that no open Device uses. Libraries from
// DefaultLibrary must not be closed.
func (l *Library) Close() error {
	libs.Forget(l)
	if l.c != nil {
		C.stage_cu_free(l.c)
		l.c = nil
	}
	return l.h.Close()
}

func (l *Library) init() error {
	l.initOnce.Do(func() {
		if rc := C.stage_init(l.c); rc != 0 {
			l.initErr = l.errorf(rc, "cuInit")
		}
	})
	return l.initErr
}

// errorf builds an *Error for a failed call; op is formatted only here, on
// the error path.
func (l *Library) errorf(rc C.CUresult, format string, args ...any) error {
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

// symbol is one entry of the bound-symbol table (shim.c).
type symbol struct {
	Name     string
	Optional bool
}

// symbols lists every export the Library resolves, in table order.
func symbols() []symbol {
	n := int(C.stage_nsyms())
	out := make([]symbol, n)
	for i := range out {
		out[i] = symbol{
			Name:     C.GoString(C.stage_sym_name(C.int(i))),
			Optional: C.stage_sym_optional(C.int(i)) != 0,
		}
	}
	return out
}
