package cuda

import (
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
	"github.com/stage-kv/stage/internal/dl"
)

// CUresult values stage reacts to.
const (
	codeOutOfMemory  = 2   // CUDA_ERROR_OUT_OF_MEMORY
	codeNotReady     = 600 // CUDA_ERROR_NOT_READY
	codeNotPermitted = 800 // CUDA_ERROR_NOT_PERMITTED
	codeNotSupported = 801 // CUDA_ERROR_NOT_SUPPORTED
)

// Error is a failed driver call: the call with the values involved (Op), the
// CUresult (Code) and the driver's own name and description of it (Name
// is "CUresult(N)" when the driver has none). acl.Error and hip.Error have
// the same fields and form.
//
//	cuda: cuMemcpyDtoHAsync(4194304 B from 0x7f...): CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered
type Error struct {
	Op   string
	Code int
	Name string
	Msg  string
}

func (e *Error) Error() string { return dl.ErrorText("cuda", e.Op, e.Name, e.Msg) }

// Is maps CUresults onto device's sentinels: out of memory onto
// ErrOutOfMemory, not supported and not permitted onto ErrNotSupported, not
// ready onto ErrNotReady.
func (e *Error) Is(target error) bool { return sentinels.Is(e.Code, target) }

var sentinels = vendorkit.Codes{
	{Err: device.ErrOutOfMemory, Codes: []int{codeOutOfMemory}},
	{Err: device.ErrNotSupported, Codes: []int{codeNotSupported, codeNotPermitted}},
	{Err: device.ErrNotReady, Codes: []int{codeNotReady}},
}
