package hip

import (
	"errors"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
	"github.com/stage-kv/stage/internal/dl"
)

// hipError_t values stage reacts to (hip/hip_runtime_api.h; they follow
// CUDA's numbering).
const (
	codeInvalidValue       = 1   // hipErrorInvalidValue
	codeOutOfMemory        = 2   // hipErrorOutOfMemory (hipErrorMemoryAllocation)
	codeNotReady           = 600 // hipErrorNotReady: hipEventQuery of pending work
	codePeerAlreadyEnabled = 704 // hipErrorPeerAccessAlreadyEnabled: success for stage
	codePeerUnsupported    = 217 // hipErrorPeerAccessUnsupported
	codeNotSupported       = 801 // hipErrorNotSupported
)

// ErrOutOfRange is returned (wrapped) when a range names bytes past the end
// of the allocation it belongs to.
var ErrOutOfRange = errors.New("out of range")

// Error is a failed HIP call: the call with the values involved (Op), the
// hipError_t (Code) and the runtime's own name and description of it
// (hipGetErrorName, hipGetErrorString; Name is "hipError_t(N)" when the
// runtime has none). cuda.Error and acl.Error have the same fields and
// form.
//
//	hip: hipMemcpyAsync(D2H, 4194304 B from 0x7f...): hipErrorInvalidValue: invalid argument
type Error struct {
	Op   string
	Code int
	Name string
	Msg  string
}

func (e *Error) Error() string { return dl.ErrorText("hip", e.Op, e.Name, e.Msg) }

// Is maps hipError_t values onto device's sentinels: out of memory onto
// ErrOutOfMemory, not supported (and peer access unsupported) onto
// ErrNotSupported, not ready onto ErrNotReady.
func (e *Error) Is(target error) bool { return sentinels.Is(e.Code, target) }

var sentinels = vendorkit.Codes{
	{Err: device.ErrOutOfMemory, Codes: []int{codeOutOfMemory}},
	{Err: device.ErrNotSupported, Codes: []int{codeNotSupported, codePeerUnsupported}},
	{Err: device.ErrNotReady, Codes: []int{codeNotReady}},
}

// code returns err's hipError_t, or 0 when err is not an *Error.
func code(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}
