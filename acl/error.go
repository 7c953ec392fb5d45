package acl

import (
	"strconv"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
	"github.com/stage-kv/stage/internal/dl"
)

// Error is a failed ACL call: the call with the values involved (Op), the
// aclError (Code), its name (Name; "aclError(N)" for a code this package
// does not know) and the runtime's own description of the failure, read
// with aclGetRecentErrMsg on the thread that failed (Msg, may be empty).
// cuda.Error and hip.Error have the same fields and form.
//
//	acl: aclrtMalloc(1073741824 B, HUGE_FIRST): ACL_ERROR_RT_MEMORY_ALLOCATION: <runtime text>
type Error struct {
	Op   string
	Code int
	Name string
	Msg  string
}

func (e *Error) Error() string { return dl.ErrorText("acl", e.Op, e.Name, e.Msg) }

// codeName is the ACL name of code, or "aclError(N)".
func codeName(code int) string {
	if n := codeNames[code]; n != "" {
		return n
	}
	return "aclError(" + strconv.Itoa(code) + ")"
}

// Is maps aclErrors onto device's sentinels: memory allocation failures onto
// ErrOutOfMemory, "feature not supported" onto ErrNotSupported, sync
// timeouts onto ErrNotReady.
func (e *Error) Is(target error) bool { return sentinels.Is(e.Code, target) }

var sentinels = vendorkit.Codes{
	{Err: device.ErrOutOfMemory, Codes: []int{codeOutOfMemory, codeDeviceOOM, codeBadAlloc}},
	{Err: device.ErrNotSupported, Codes: []int{codeNotSupported, codeAPINotSupported, codeFeatureUnsupp}},
	{Err: device.ErrNotReady, Codes: []int{codeStreamTimeout, codeEventTimeout}},
}

// codeNames are the codes stage is likely to meet (CANN's aclError list).
var codeNames = map[int]string{
	100000: "ACL_ERROR_INVALID_PARAM",
	100001: "ACL_ERROR_UNINITIALIZE",
	100002: "ACL_ERROR_REPEAT_INITIALIZE",
	107000: "ACL_ERROR_RT_PARAM_INVALID",
	107001: "ACL_ERROR_RT_INVALID_DEVICEID",
	107002: "ACL_ERROR_RT_CONTEXT_NULL",
	107003: "ACL_ERROR_RT_STREAM_CONTEXT",
	107017: "ACL_ERROR_RT_INVALID_HANDLE",
	107019: "ACL_ERROR_RT_WAIT_TIMEOUT",
	200000: "ACL_ERROR_BAD_ALLOC",
	200001: "ACL_ERROR_API_NOT_SUPPORT",
	200006: "ACL_ERROR_FEATURE_UNSUPPORTED",
	207000: "ACL_ERROR_RT_FEATURE_NOT_SUPPORT",
	207001: "ACL_ERROR_RT_MEMORY_ALLOCATION",
	207002: "ACL_ERROR_RT_MEMORY_FREE",
	207004: "ACL_ERROR_RT_NO_DEVICE",
	207006: "ACL_ERROR_RT_NO_PERMISSION",
	207007: "ACL_ERROR_RT_NO_EVENT_RESOURCE",
	207008: "ACL_ERROR_RT_NO_STREAM_RESOURCE",
	207018: "ACL_ERROR_RT_DEVIDE_OOM",
	500000: "ACL_ERROR_INTERNAL_ERROR",
	507000: "ACL_ERROR_RT_INTERNAL_ERROR",
	507001: "ACL_ERROR_RT_TS_ERROR",
	507013: "ACL_ERROR_RT_SYS_DMA",
	507022: "ACL_ERROR_RT_IPC_ERROR",
	507046: "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT",
	507047: "ACL_ERROR_RT_EVENT_SYNC_TIMEOUT",
	507053: "ACL_ERROR_RT_DEVICE_MEM_ERROR",
	507899: "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
	507910: "ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	507911: "ACL_ERROR_HOST_MEMORY_NOT_REGISTERED",
}
