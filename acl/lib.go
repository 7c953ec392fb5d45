package acl

/*
#cgo CFLAGS: -O2 -Wall
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"cmp"
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/stage-kv/stage/internal/dl"
)

// DefaultLibraryName is the runtime opened when device.acl.library
// (Config.Library) names no other. CANN's set_env.sh puts its directory on
// LD_LIBRARY_PATH.
const DefaultLibraryName = "libascendcl.so"

// Symbol groups of the bound table (STACL_SYM_* in shim.h).
const (
	symIPC       = C.STACL_SYM_IPC        // the aclrtIpcMem* calls
	symVMM       = C.STACL_SYM_VMM        // VMM import
	symVMMExport = C.STACL_SYM_VMM_EXPORT // VMM allocation and export (engines, tests)
)

// aclError values stage reacts to (CANN's acl_base.h / acl_rt.h).
const (
	codeRepeatInit      = 100002 // ACL_ERROR_REPEAT_INITIALIZE: torch_npu (or anyone) called aclInit first
	codeBadAlloc        = 200000 // ACL_ERROR_BAD_ALLOC
	codeAPINotSupported = 200001 // ACL_ERROR_API_NOT_SUPPORT
	codeFeatureUnsupp   = 200006 // ACL_ERROR_FEATURE_UNSUPPORTED
	codeNotSupported    = 207000 // ACL_ERROR_RT_FEATURE_NOT_SUPPORT
	codeOutOfMemory     = 207001 // ACL_ERROR_RT_MEMORY_ALLOCATION
	codeDeviceOOM       = 207018 // ACL_ERROR_RT_DEVIDE_OOM
	codeStreamTimeout   = 507046 // ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
	codeEventTimeout    = 507047 // ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
)

// Library is libascendcl opened with dlopen, every entry point resolved once
// at open into a field of a C struct (shim.h lists each with its C
// prototype). A Library is safe for concurrent use and is shared by the
// Devices opened from it.
type Library struct {
	*dl.Lib // Path, Absent, AbsentList
	c       *C.stacl_acl

	batch      bool // aclrtMemcpyBatchAsync
	ipc        bool // all four aclrtIpcMem* calls
	ipcWhy     string
	fastStream bool // aclrtCreateStreamWithConfig
	vmm        bool // the VMM import calls (device.HandleACLVMM)
	vmmWhy     string
	vmmExport  bool // the VMM allocation and export calls

	initOnce   sync.Once
	initErr    error
	initRepeat bool // aclInit answered ACL_ERROR_REPEAT_INITIALIZE
}

// OpenLibrary opens the ACL runtime at path ("" means DefaultLibraryName)
// and resolves every symbol stage uses. A missing required symbol fails the
// open with one error that lists them all; missing optional ones are
// recorded in Absent with what each costs.
func OpenLibrary(path string) (*Library, error) {
	path = cmp.Or(path, DefaultLibraryName)
	c := C.stacl_acl_new()
	if c == nil {
		return nil, fmt.Errorf("acl: %s: out of memory for the symbol table", path)
	}
	lib, err := dl.Load(path, dl.Binding{
		Lib:     "acl",
		Install: "is CANN installed (source its set_env.sh so libascendcl.so is on LD_LIBRARY_PATH) or device.acl.library set?",
		TooOld:  "CANN too old, or not libascendcl?",
		Table:   symbols(),
		Set:     func(i int, p unsafe.Pointer) { C.stacl_sym_set(c, C.int(i), p) },
		Absent:  absentReason,
	})
	if err != nil {
		C.stacl_acl_free(c)
		return nil, err
	}
	l := &Library{Lib: lib, c: c}
	l.batch = c.aclrtMemcpyBatchAsync != nil
	l.fastStream = c.aclrtCreateStreamWithConfig != nil
	l.ipc = len(lib.Missing(symIPC)) == 0
	if !l.ipc {
		l.ipcWhy = fmt.Sprintf("%s lacks %d of the 4 aclrtIpcMem* entry points", path, len(lib.Missing(symIPC)))
	}
	l.vmm = len(lib.Missing(symVMM)) == 0
	if !l.vmm {
		l.vmmWhy = fmt.Sprintf("%s lacks %s (CANN without the VMM calls)", path, strings.Join(lib.Missing(symVMM), ", "))
	}
	l.vmmExport = len(lib.Missing(symVMMExport)) == 0
	return l, nil
}

func absentReason(group int, name string) string {
	switch group {
	case symIPC:
		return "import by export key (device.HandleACLKey) unavailable; needs a CANN with aclrtIpcMem* (8.x)"
	case symVMM:
		return "import of VMM memory (device.HandleACLVMM: torch_npu's expandable segments, vllm-ascend's default) unavailable"
	case symVMMExport:
		return "engine-side VMM allocation and export (AllocVMM, ExportVMM) unavailable; the sidecar does not need them"
	}
	switch name {
	case "aclrtMemcpyBatchAsync":
		return "batched copies absent (CANN older than 8.3); multi-block chunks are packed on the device (pack mode)"
	case "aclrtCreateStreamWithConfig":
		return "streams are made with aclrtCreateStream (no FAST_LAUNCH|FAST_SYNC)"
	case "aclrtDeviceGetBareTgid":
		return "BareTgid falls back to getpid(), which is wrong inside containers and VMs"
	case "aclrtMemGetAddressRange":
		return "Import trusts the allocation size the engine claims"
	case "aclrtGetPhyDevIdByLogicDevId":
		return "the NPU's physical id is unknown: memory of another NPU is refused by the import's probe copy, not by its id"
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

// HasBatchCopy reports whether aclrtMemcpyBatchAsync is exported.
func (l *Library) HasBatchCopy() bool { return l.batch }

// HasIPC reports whether the aclrtIpcMem* calls are exported.
func (l *Library) HasIPC() bool { return l.ipc }

// HasVMM reports whether the VMM import calls are exported.
func (l *Library) HasVMM() bool { return l.vmm }

// BareTgidSource says where BareTgid comes from, and why it may be wrong.
func (l *Library) BareTgidSource() string {
	if l.c.aclrtDeviceGetBareTgid == nil {
		return "getpid(): " + l.Path() + " lacks aclrtDeviceGetBareTgid; wrong across pid namespaces (containers) and VMs"
	}
	return "aclrtDeviceGetBareTgid"
}

// BareTgid returns this process's id as the ACL IPC whitelist wants it
// (aclrtDeviceGetBareTgid: the host pid, also inside containers), or
// getpid() when the library lacks the call. A sidecar reports it to the
// engines that export memory to it.
func (l *Library) BareTgid() (int32, error) {
	if l.c.aclrtDeviceGetBareTgid == nil {
		return int32(os.Getpid()), nil
	}
	var pid C.int32_t
	if err := l.check(C.stacl_bare_tgid(l.c, &pid), "aclrtDeviceGetBareTgid"); err != nil {
		return 0, err
	}
	return int32(pid), nil
}

// Close unloads a library that no open Device uses. Libraries from
// SharedLibrary must not be closed.
func (l *Library) Close() error {
	libs.Forget(l)
	if l.c != nil {
		C.stacl_acl_free(l.c)
		l.c = nil
	}
	return l.Lib.Close()
}

// init calls aclInit(NULL) once. ACL_ERROR_REPEAT_INITIALIZE means someone
// in this process (torch_npu, another Library over the same file) already
// did: that is success. stage never calls aclFinalize: other users of the
// runtime in the process would lose it.
func (l *Library) init() error {
	l.initOnce.Do(func() {
		r := C.stacl_init(l.c)
		if r.rc == codeRepeatInit {
			l.initRepeat = true
			freeMsg(r)
			return
		}
		l.initErr = l.check(r, "aclInit(NULL)")
	})
	return l.initErr
}

// check turns a trampoline's result into nil or an *Error; op is formatted
// only on the error path.
func (l *Library) check(r C.stacl_ret, format string, args ...any) error {
	if r.rc == 0 {
		freeMsg(r)
		return nil
	}
	e := &Error{Op: format, Code: int(r.rc), Name: codeName(int(r.rc))}
	if len(args) > 0 {
		e.Op = fmt.Sprintf(format, args...)
	}
	if r.msg != nil {
		e.Msg = strings.TrimSpace(C.GoString(r.msg))
	}
	freeMsg(r)
	return e
}

func freeMsg(r C.stacl_ret) {
	if r.msg != nil {
		C.free(unsafe.Pointer(r.msg))
	}
}

// symbols lists every export the Library resolves, in table order, with
// its group (dl.Required, symIPC, or another optional one).
func symbols() []dl.Sym {
	n := int(C.stacl_nsyms())
	out := make([]dl.Sym, n)
	for i := range out {
		out[i] = dl.Sym{Name: C.GoString(C.stacl_sym_name(C.int(i))), Group: int(C.stacl_sym_group(C.int(i)))}
	}
	return out
}
