package acl

import (
	"fmt"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

// CopyMode says how a Stream moves a chunk made of several segments. A chunk
// whose segments merge into one contiguous range always takes one plain
// aclrtMemcpyAsync, whatever the mode.
type CopyMode string

// Copy modes.
const (
	// CopyAuto picks batch when the library exports aclrtMemcpyBatchAsync,
	// else pack.
	CopyAuto CopyMode = ""
	// CopyBatch issues one aclrtMemcpyBatchAsync per chunk (CANN 8.3+).
	CopyBatch CopyMode = "batch"
	// CopyPack copies each block device-to-device into a per-stream device
	// ring, then moves the packed chunk with one D2H (and the reverse for
	// scatter: one H2D, then a D2D per block), so the host link always sees
	// slot-sized copies.
	CopyPack CopyMode = "pack"
	// CopyPerCopy issues one D2H (or H2D) aclrtMemcpyAsync per block,
	// straight between the block and the pinned slot.
	CopyPerCopy CopyMode = "percopy"
)

// ParseCopyMode reads a mode as device.acl.copy_mode spells it; "" and
// "auto" mean CopyAuto.
func ParseCopyMode(s string) (CopyMode, error) {
	return vendorkit.ParseMode[CopyMode]("acl", s, "batch", "pack", "percopy")
}

// chooseCopyMode decides a device's mode: batchErr is why
// aclrtMemcpyBatchAsync cannot be used (nil when it can). It returns the
// mode and a sentence for the log. A requested mode that is unavailable is
// an error wrapping device.ErrNotSupported.
func chooseCopyMode(want CopyMode, batchErr error) (CopyMode, string, error) {
	switch want {
	case CopyBatch:
		if batchErr != nil {
			return "", "", fmt.Errorf("acl: copy mode batch requested but unavailable: %v: %w", batchErr, device.ErrNotSupported)
		}
		return CopyBatch, "batch (requested)", nil
	case CopyPack, CopyPerCopy:
		return want, string(want) + " (requested)", nil
	case CopyAuto:
	default:
		return "", "", fmt.Errorf("acl: unknown copy mode %q", want)
	}
	if batchErr == nil {
		return CopyBatch, "batch (auto)", nil
	}
	return CopyPack, fmt.Sprintf("pack (auto; batch unavailable: %v)", batchErr), nil
}
