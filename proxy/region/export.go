package region

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// exportHandle keeps what a same-node peer needs to import the allocation
// behind h: a duplicate of its fd (memfd, POSIX fd) or a copy of its IPC
// handle bytes. Addresses of this process (HandleHostAddr) cannot be
// exported: their kind becomes HandleNone. closeExport lets go of it.
func exportHandle(h device.Handle) (device.Handle, error) {
	exp := device.Handle{Kind: h.Kind, FD: -1, Size: h.Size}
	switch h.Kind {
	case device.HandleMemfd, device.HandlePosixFD:
		fd, err := unix.FcntlInt(uintptr(h.FD), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return device.Handle{}, fmt.Errorf("dup %s fd %d: %w", h.Kind, h.FD, err)
		}
		exp.FD = fd
	case device.HandleCUDAIPC, device.HandleHIPIPC, device.HandleACLKey:
		exp.Bytes = bytes.Clone(h.Bytes)
	default:
		exp.Kind = device.HandleNone
	}
	return exp, nil
}

func closeExport(h device.Handle) {
	if h.FD >= 0 {
		_ = unix.Close(h.FD)
	}
}

// HandleFor describes region r to a same-node peer: the frame, and the fd
// that travels with it (-1 when none; it stays owned by the region table,
// the caller only sends it). It holds no reference: the caller holds r.
func HandleFor(r *Region, dev string, transfer uint64, idx int) (*wire.RegionHandle, int, error) {
	exp := r.imp.exp
	if exp.Kind == device.HandleNone {
		return nil, -1, status.Errorf(wire.CodeUnsupported, "region %s was registered as %s memory, which cannot be handed to another process", r.Name, r.Handle)
	}
	return &wire.RegionHandle{Transfer: transfer, Index: uint32(idx), RegionID: r.ID, Kind: uint8(exp.Kind), Access: r.Access,
		AllocKey: wireKey(r.imp.key), AllocSize: exp.Size, Offset: r.Off, Length: r.Len, Device: dev, Raw: exp.Bytes}, exp.FD, nil
}

// wireKey fits an allocation key into a frame's name field: long keys
// (IPC handles in hex) travel as their SHA-256.
func wireKey(k string) string {
	if len(k) <= wire.MaxName {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return "sha256:" + hex.EncodeToString(sum[:])
}
