package acl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/stage-kv/stage/device"
)

func vmmBytes(phys int32, off uint64, chunks ...VMMChunk) []byte {
	return VMMHandle{PhysDevice: phys, Offset: off, Chunks: chunks}.Encode()
}

func TestDecodeVMM(t *testing.T) {
	c := func(sh, n uint64) VMMChunk { return VMMChunk{Shareable: sh, Size: n} }
	good := vmmBytes(3, 100, c(1, 4096), c(2, 4096), c(3, 4096))
	patch := func(b []byte, at int, v ...byte) []byte {
		b = bytes.Clone(b)
		copy(b[at:], v)
		return b
	}
	le32 := func(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
	for _, tc := range []struct {
		name string
		b    []byte
		size uint64
		want string // "" = ok
	}{
		{"three chunks, mid-chunk start", good, 3*4096 - 100, ""},
		{"region ends inside the last chunk", good, 2*4096 - 99, ""},
		{"one chunk at 0", vmmBytes(-1, 0, c(9, 1<<21)), 1 << 21, ""},
		{"short", good[:23], 1, "shorter than its 24-byte header"},
		{"version", patch(good, 0, 2), 1, "version 2"},
		{"reserved", patch(good, 2, 1), 1, "reserved bytes"},
		{"reserved tail", patch(good, 20, 1), 1, "reserved bytes"},
		{"no chunks", patch(good[:24], 16, le32(0)...), 1, "0 chunks"},
		{"too many chunks", patch(good, 16, le32(MaxVMMChunks+1)...), 1, "4095 chunks"},
		{"count past the bytes", patch(good, 16, le32(4)...), 1, "for 4 chunks"},
		{"trailing bytes", append(bytes.Clone(good), 0), 1, "for 3 chunks"},
		{"physical device", patch(good, 4, le32(math.MaxUint32-1)...), 1, "physical device -2"},
		{"size 0", good, 0, "region size 0"},
		{"chunk of 0 B", vmmBytes(0, 0, c(1, 4096), c(2, 0)), 4096, "chunk 1 has size 0"},
		{"overflowing sizes", vmmBytes(0, 0, c(1, math.MaxUint64), c(2, 2)), 1, "overflow at chunk 1"},
		{"same chunk twice", vmmBytes(0, 0, c(1, 4096), c(1, 4096)), 8192, "chunks 0 and 1"},
		{"offset past the first chunk", vmmBytes(0, 4096, c(1, 4096), c(2, 4096)), 1, "not inside the first chunk"},
		{"region past the chunks", good, 3*4096 - 99, "past the end of its 3 chunks"},
		{"a chunk too many", good, 4096 - 100, "the last chunk holds none"},
		{"huge size", good, math.MaxUint64, "past the end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := DecodeVMM(tc.b, tc.size)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(h.Encode(), tc.b) {
					t.Errorf("Encode(Decode(b)) differs from b")
				}
				return
			}
			if err == nil || !errors.Is(err, errVMM) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("DecodeVMM: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func FuzzDecodeVMM(f *testing.F) {
	f.Add(vmmBytes(0, 7, VMMChunk{1, 4096}, VMMChunk{2, 8192}), uint64(9000))
	f.Add(vmmBytes(-1, 0, VMMChunk{1, math.MaxUint64}), uint64(1))
	f.Add([]byte{1, 0, 0, 0}, uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, size uint64) {
		h, err := DecodeVMM(b, size)
		if err != nil {
			return
		}
		// What decodes is what it says: the region lies inside the chunks,
		// and re-encodes to the same bytes.
		if size == 0 || size > h.Span() || h.Offset >= h.Chunks[0].Size || len(h.Chunks) > MaxVMMChunks {
			t.Fatalf("accepted %+v for %d B", h, size)
		}
		if !bytes.Equal(h.Encode(), b) {
			t.Fatal("Encode(Decode(b)) != b")
		}
	})
}

func TestImportVMMBadHandle(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, Config{})
	_, err := d.Import(device.Handle{Kind: device.HandleACLVMM, Bytes: vmmBytes(-1, 0, VMMChunk{1, 4096}), Size: 4097, FD: -1})
	if !errors.Is(err, device.ErrBadHandle) || !strings.Contains(err.Error(), "past the end") {
		t.Errorf("Import of a region past its chunks: %v, want ErrBadHandle", err)
	}
}

func TestImportVMMAbsent(t *testing.T) {
	// A library without the VMM calls opens; the import says what is missing.
	l := fakeLibrary(t, "-DFAKEACL_NO_VMM")
	if l.HasVMM() || !strings.Contains(strings.Join(l.AbsentList(), "\n"), "aclrtMapMem") {
		t.Fatalf("HasVMM %v, absent %v", l.HasVMM(), l.AbsentList())
	}
	d := openDev(t, l, Config{})
	_, err := d.Import(device.Handle{Kind: device.HandleACLVMM, Bytes: vmmBytes(-1, 0, VMMChunk{1, 4096}), Size: 1, FD: -1})
	if !errors.Is(err, device.ErrNotSupported) || !strings.Contains(err.Error(), "aclrtMemImportFromShareableHandle") {
		t.Errorf("Import without the VMM calls: %v", err)
	}
}

// TestBareTgid: the sidecar reports the driver's id for itself, and where a
// library lacks aclrtDeviceGetBareTgid it says that getpid() stands in and
// why that may be wrong.
func TestBareTgid(t *testing.T) {
	t.Setenv("FAKEACL_TGID_OFFSET", "7")
	d := openDev(t, fakeLibrary(t), Config{})
	pid, src, err := d.BareTgid()
	if err != nil || pid != int32(os.Getpid()+7) || src != "aclrtDeviceGetBareTgid" {
		t.Errorf("BareTgid = %d (%q), %v; want getpid()+7 from aclrtDeviceGetBareTgid", pid, src, err)
	}
	d = openDev(t, fakeLibrary(t, "-DFAKEACL_NO_BARE_TGID"), Config{})
	pid, src, err = d.BareTgid()
	if err != nil || pid != int32(os.Getpid()) || !strings.Contains(src, "lacks aclrtDeviceGetBareTgid") || !strings.Contains(src, "pid namespaces") {
		t.Errorf("BareTgid without the call = %d (%q), %v; want getpid() and why it may be wrong", pid, src, err)
	}
}
