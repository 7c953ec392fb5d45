package acl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
)

// VMM memory (device.HandleACLVMM): an engine whose memory is mapped from
// physical chunks (torch_npu's expandable segments, vllm-ascend's sleep-mode
// pool: aclrtReserveMemAddress + aclrtMallocPhysical + aclrtMapMem) shares a
// region by exporting every chunk under it (aclrtMemExportToShareableHandle)
// and listing them, in address order, in the handle's bytes. The sidecar
// imports each chunk, maps them in order into one reserved range, and the
// region starts Offset bytes into the first chunk. docs/PROTOCOL.md
// (section 5, HandleACLVMM) gives the layout byte by byte:
//
//	0   u8   Version (1)
//	1   3    reserved, 0
//	4   i32  PhysDevice: the exporter's physical NPU id, -1 when unknown
//	8   u64  Offset: where the region starts inside the first chunk
//	16  u32  Count: chunks, 1..MaxVMMChunks
//	20  u32  reserved, 0
//	24  Count × {u64 Shareable, u64 Size}
//
// All little-endian. Handle.Size is the region's length: the chunks must
// cover [Offset, Offset+Size) and every one of them must be needed.

const (
	vmmVersion   = 1
	vmmHeader    = 24
	vmmChunkSize = 16
	// MaxVMMChunks bounds a region's chunk list (what fits in
	// wire.MaxHandleBytes): 4094 chunks of torch_npu's 2 MiB pages are
	// 8 GiB, of its 20 MiB pages 80 GiB.
	MaxVMMChunks = 4094
)

// VMMChunk is one physical chunk of a VMM region.
type VMMChunk struct {
	Shareable uint64 // aclrtMemExportToShareableHandle's handle
	Size      uint64 // bytes, as mapped (aclrtMemGetAddressRange of the chunk)
}

// VMMHandle is the decoded payload of a device.HandleACLVMM.
type VMMHandle struct {
	PhysDevice int32 // the exporter's physical NPU id; -1 unknown
	Offset     uint64
	Chunks     []VMMChunk
}

// errVMM marks a payload that does not decode.
var errVMM = errors.New("acl-vmm handle")

// Encode lays h out as the handle's bytes.
func (h VMMHandle) Encode() []byte {
	b := make([]byte, vmmHeader, vmmHeader+vmmChunkSize*len(h.Chunks))
	b[0] = vmmVersion
	binary.LittleEndian.PutUint32(b[4:], uint32(h.PhysDevice))
	binary.LittleEndian.PutUint64(b[8:], h.Offset)
	binary.LittleEndian.PutUint32(b[16:], uint32(len(h.Chunks)))
	for _, c := range h.Chunks {
		b = binary.LittleEndian.AppendUint64(b, c.Shareable)
		b = binary.LittleEndian.AppendUint64(b, c.Size)
	}
	return b
}

// Span is the bytes the chunks hold from Offset to the end of the last.
func (h VMMHandle) Span() uint64 {
	var total uint64
	for _, c := range h.Chunks {
		total += c.Size
	}
	return total - h.Offset
}

// DecodeVMM decodes and checks a device.HandleACLVMM payload for a region
// of size bytes: the layout, the chunk count, chunk sizes (none 0, their
// sum without overflow), Offset inside the first chunk, the region inside
// the chunks, and no chunk past the one that holds its last byte.
func DecodeVMM(b []byte, size uint64) (VMMHandle, error) {
	var h VMMHandle
	if len(b) < vmmHeader {
		return h, fmt.Errorf("%w: %d bytes, shorter than its %d-byte header", errVMM, len(b), vmmHeader)
	}
	if b[0] != vmmVersion {
		return h, fmt.Errorf("%w: version %d, this sidecar reads %d", errVMM, b[0], vmmVersion)
	}
	if b[1]|b[2]|b[3] != 0 || binary.LittleEndian.Uint32(b[20:]) != 0 {
		return h, fmt.Errorf("%w: reserved bytes are not 0", errVMM)
	}
	h.PhysDevice = int32(binary.LittleEndian.Uint32(b[4:]))
	h.Offset = binary.LittleEndian.Uint64(b[8:])
	n := binary.LittleEndian.Uint32(b[16:])
	if n == 0 || n > MaxVMMChunks {
		return h, fmt.Errorf("%w: %d chunks, want 1 to %d", errVMM, n, MaxVMMChunks)
	}
	if want := vmmHeader + vmmChunkSize*int(n); len(b) != want {
		return h, fmt.Errorf("%w: %d bytes for %d chunks, want %d", errVMM, len(b), n, want)
	}
	if h.PhysDevice < -1 {
		return h, fmt.Errorf("%w: physical device %d", errVMM, h.PhysDevice)
	}
	if size == 0 {
		return h, fmt.Errorf("%w: region size 0", errVMM)
	}
	h.Chunks = make([]VMMChunk, n)
	seen := make(map[uint64]int, n)
	var total uint64
	for i := range h.Chunks {
		p := b[vmmHeader+vmmChunkSize*i:]
		c := VMMChunk{Shareable: binary.LittleEndian.Uint64(p), Size: binary.LittleEndian.Uint64(p[8:])}
		if c.Size == 0 {
			return h, fmt.Errorf("%w: chunk %d has size 0", errVMM, i)
		}
		var carry uint64
		if total, carry = bits.Add64(total, c.Size, 0); carry != 0 {
			return h, fmt.Errorf("%w: chunk sizes overflow at chunk %d", errVMM, i)
		}
		if j, dup := seen[c.Shareable]; dup {
			return h, fmt.Errorf("%w: chunks %d and %d are the same shareable handle %#x", errVMM, j, i, c.Shareable)
		}
		seen[c.Shareable] = i
		h.Chunks[i] = c
	}
	if h.Offset >= h.Chunks[0].Size {
		return h, fmt.Errorf("%w: offset %d is not inside the first chunk (%d B)", errVMM, h.Offset, h.Chunks[0].Size)
	}
	span := total - h.Offset
	if size > span {
		return h, fmt.Errorf("%w: region of %d B at offset %d is past the end of its %d chunks (%d B)", errVMM, size, h.Offset, n, total)
	}
	if last := h.Chunks[n-1].Size; span-size >= last {
		return h, fmt.Errorf("%w: the last chunk holds none of the region (%d B at offset %d in %d B of chunks): list only the chunks under it", errVMM, size, h.Offset, total)
	}
	return h, nil
}
