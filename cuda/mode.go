package cuda

import (
	"fmt"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

// CopyMode says how a Stream moves a chunk made of several segments. A chunk
// of one segment always takes one plain cuMemcpy*Async, whatever the mode.
type CopyMode string

// Copy modes.
const (
	// CopyAuto picks the best available: kernel, then batch, then percopy.
	CopyAuto CopyMode = ""
	// CopyKernel launches the gather/scatter kernel once per chunk; it reads
	// and writes the pinned slot through its device address.
	CopyKernel CopyMode = "kernel"
	// CopyBatch issues one cuMemcpyBatchAsync per chunk (CUDA 12.8+).
	CopyBatch CopyMode = "batch"
	// CopyPerCopy issues one cuMemcpy*Async per segment.
	CopyPerCopy CopyMode = "percopy"
)

// ParseCopyMode reads a mode name as device.cuda.copy_mode spells it; ""
// and "auto" mean CopyAuto.
func ParseCopyMode(s string) (CopyMode, error) {
	return vendorkit.ParseMode[CopyMode]("cuda", s, "kernel", "batch", "percopy")
}

// chooseCopyMode decides the mode of a device from what is available:
// kernelErr is why the kernel cannot be used (nil when it loaded), batchErr
// why cuMemcpyBatchAsync cannot. It returns the mode and a sentence for the
// log. An explicitly requested mode that is unavailable is an error that
// wraps device.ErrNotSupported.
func chooseCopyMode(want CopyMode, kernelErr, batchErr error) (CopyMode, string, error) {
	switch want {
	case CopyKernel:
		if kernelErr != nil {
			return "", "", fmt.Errorf("cuda: copy mode kernel requested but unavailable: %v: %w", kernelErr, device.ErrNotSupported)
		}
		return CopyKernel, "kernel (requested)", nil
	case CopyBatch:
		if batchErr != nil {
			return "", "", fmt.Errorf("cuda: copy mode batch requested but unavailable: %v: %w", batchErr, device.ErrNotSupported)
		}
		return CopyBatch, "batch (requested)", nil
	case CopyPerCopy:
		return CopyPerCopy, "percopy (requested)", nil
	case CopyAuto:
	default:
		return "", "", fmt.Errorf("cuda: unknown copy mode %q", want)
	}
	if kernelErr == nil {
		return CopyKernel, "kernel (auto)", nil
	}
	if batchErr == nil {
		return CopyBatch, fmt.Sprintf("batch (auto; kernel unavailable: %v)", kernelErr), nil
	}
	return CopyPerCopy, fmt.Sprintf("percopy (auto; kernel unavailable: %v; batch unavailable: %v)", kernelErr, batchErr), nil
}

// fallbackMode is what a kernel-mode stream uses for a chunk the kernel
// cannot take (a Pinned without a device address).
func fallbackMode(batchErr error) CopyMode {
	if batchErr == nil {
		return CopyBatch
	}
	return CopyPerCopy
}

// EventWait says how a copy's completion is waited for. Spinning answers
// soonest but keeps a core busy for the whole copy; blocking sleeps on an
// interrupt and costs a wake-up; hybrid polls for hybridSpin, then blocks,
// so short copies finish inside the poll and long ones cost no CPU.
type EventWait string

// Event wait modes (device.cuda.event_wait).
const (
	WaitAuto   EventWait = ""
	WaitSpin   EventWait = "spin"
	WaitBlock  EventWait = "block"
	WaitHybrid EventWait = "hybrid"
)

// hybridSpin is how long WaitHybrid polls before it blocks: about the time
// of a 1 MiB copy over PCIe Gen5, so small chunks never sleep.
const hybridSpin = 20_000 // ns

func (w EventWait) spin() int64 {
	switch w {
	case WaitSpin:
		return 0 // cuEventSynchronize spins by itself on a non-blocking event
	case WaitHybrid:
		return hybridSpin
	}
	return 0
}

// ParseEventWait reads a mode as device.cuda.event_wait spells it; "" and
// "auto" mean the default, WaitHybrid.
func ParseEventWait(s string) (EventWait, error) {
	switch s {
	case "", "auto":
		return WaitHybrid, nil
	case "spin", "block", "hybrid":
		return EventWait(s), nil
	}
	return "", fmt.Errorf("cuda: event wait %q: want spin, block, hybrid or auto", s)
}
