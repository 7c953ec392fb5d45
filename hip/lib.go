package hip

/*
#cgo CFLAGS: -O2 -Wall
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

// DefaultLibraryName is the runtime opened when neither a path nor
// $STAGE_HIP_LIBRARY names another. ROCm puts it in /opt/rocm/lib, which its
// ld.so.conf entry or LD_LIBRARY_PATH makes visible.
const DefaultLibraryName = "libamdhip64.so"

// LibraryEnv names the environment variable that overrides the library path.
const LibraryEnv = "STAGE_HIP_LIBRARY"

// Library is libamdhip64 opened with dlopen, every entry point resolved once
// at open into a field of a C struct (shim.h lists each with its C
// prototype). A Library is safe for concurrent use and is shared by the
// Devices opened from it.
type Library struct {
	path   string
	h      *dl.Handle
	c      *C.sthip_hip
	absent map[string]string // optional export -> what its absence costs

	initOnce sync.Once
	initErr  error
}

// OpenLibrary opens the HIP runtime at path ("" means $STAGE_HIP_LIBRARY,
// or libamdhip64.so when that is unset) and resolves every symbol stage
// uses. A missing required symbol fails the open with one error naming the
// library and every missing symbol; missing optional ones are recorded in
// Absent with what each costs.
func OpenLibrary(path string) (*Library, error) {
	path = libraryPath(path)
	h, err := dl.Open(path)
	if err != nil {
		return nil, fmt.Errorf("hip: dlopen %s: %v; is ROCm installed (libamdhip64.so on the loader path, e.g. /opt/rocm/lib) or %s set?", path, err, LibraryEnv)
	}
	c := C.sthip_hip_new()
	if c == nil {
		h.Close()
		return nil, fmt.Errorf("hip: %s: out of memory for the symbol table", path)
	}
	l := &Library{path: path, h: h, c: c, absent: map[string]string{}}
	var missing []string
	for _, s := range symbols() {
		p := h.Lookup(s.Name)
		if p == nil {
			if s.Group == C.STHIP_SYM_REQUIRED {
				missing = append(missing, s.Name)
			} else {
				l.absent[s.Name] = absentReason(s.Name)
			}
			continue
		}
		C.sthip_sym_set(c, C.int(s.index), p)
	}
	if len(missing) > 0 {
		C.sthip_hip_free(c)
		h.Close()
		return nil, fmt.Errorf("hip: %s: missing %s; ROCm too old, or not libamdhip64?", path, strings.Join(missing, ", "))
	}
	return l, nil
}

func libraryPath(path string) string {
	if path != "" {
		return path
	}
	if p := os.Getenv(LibraryEnv); p != "" {
		return p
	}
	return DefaultLibraryName
}

func absentReason(name string) string {
	if name == "hipDeviceEnablePeerAccess" {
		return "EnablePeerAccess unavailable; IPC imports still enable it lazily (hipIpcMemLazyEnablePeerAccess)"
	}
	return "unused"
}

var libs dl.Cache[*Library]

// DefaultLibrary returns the process-wide library for $STAGE_HIP_LIBRARY (or
// libamdhip64.so), opening it on first use. A failed open is not
// remembered: a later call tries again. Libraries opened here are never
// closed.
func DefaultLibrary() (*Library, error) {
	return libs.Get(libraryPath(""), OpenLibrary)
}

// Path returns the path the library was opened with.
func (l *Library) Path() string { return l.path }

// Absent lists each optional export the library lacks with what that
// costs, sorted, one "name: reason" per entry.
func (l *Library) Absent() []string {
	out := make([]string, 0, len(l.absent))
	for k, v := range l.absent {
		out = append(out, k+": "+v)
	}
	sort.Strings(out)
	return out
}

// Close unloads a library that no open Device uses. Libraries from
// DefaultLibrary must not be closed.
func (l *Library) Close() error {
	libs.Forget(l)
	if l.c != nil {
		C.sthip_hip_free(l.c)
		l.c = nil
	}
	return l.h.Close()
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
	if r.msg != nil {
		e.Msg = strings.TrimSpace(C.GoString(r.msg))
	}
	return e
}

// symbol is one entry of the bound-symbol table (shim.c).
type symbol struct {
	Name  string
	Group int // 0 required, 1 optional
	index int
}

// symbols lists every export the Library resolves, in table order.
func symbols() []symbol {
	n := int(C.sthip_nsyms())
	out := make([]symbol, n)
	for i := range out {
		out[i] = symbol{Name: C.GoString(C.sthip_sym_name(C.int(i))), Group: int(C.sthip_sym_group(C.int(i))), index: i}
	}
	return out
}
