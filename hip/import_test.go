package hip

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stage-kv/stage/device"
)

// The fake opens a handle at the allocation BASE, like the runtime, so every
// test below that reads or writes a region at a non-zero offset fails if
// the offset is dropped anywhere between export and copy.

const (
	ipcAllocSize = 4 << 20
	ipcViewOff   = 1_000_003 // odd: the region is a sub-range of the allocation
	ipcViewLen   = 2<<20 + 5
	ipcWriteOff  = 300_001 // inside the region
	ipcWriteLen  = 65_537
)

func TestExport(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, 0)
	base, _ := filled(t, d, 1<<20, 10)
	other, _ := filled(t, d, 8192, 11)
	tests := []struct {
		name string
		ptr  device.Addr
		base device.Addr
		off  uint64
		size uint64
	}{
		{"the base", base, base, 0, 1 << 20},
		{"one byte in", base + 1, base, 1, 1 << 20},
		{"an odd interior pointer", base + 777_777, base, 777_777, 1 << 20},
		{"the last byte", base + 1<<20 - 1, base, 1<<20 - 1, 1 << 20},
		{"another allocation", other + 4096, other, 4096, 8192},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x, err := d.Export(tc.ptr)
			if err != nil {
				t.Fatal(err)
			}
			if x.Base != tc.base || x.Offset != tc.off || x.Handle.Size != tc.size {
				t.Errorf("Export(%#x) = base %#x offset %d size %d, want base %#x offset %d size %d",
					uint64(tc.ptr), uint64(x.Base), x.Offset, x.Handle.Size, uint64(tc.base), tc.off, tc.size)
			}
			h := x.Handle
			if h.Kind != device.HandleHIPIPC || len(h.Bytes) != 64 || h.Size != tc.size || h.FD != -1 {
				t.Errorf("Export(%#x).Handle = %+v", uint64(tc.ptr), h)
			}
		})
	}
	if n := hook(t, l, "fakehip_interior_exports"); n != 0 {
		t.Errorf("%d handles were made from interior pointers; export the base", n)
	}
	_, err := d.Export(base + 1<<30)
	if err == nil || !strings.HasPrefix(err.Error(), fmt.Sprintf("hip: hipMemGetAddressRange(%#x): hipErrorInvalidDevicePointer", uint64(base+1<<30))) {
		t.Errorf("Export of an address outside any allocation: %v", err)
	}
}

func TestImportRegionSameProcess(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, 0)
	base, data := filled(t, d, ipcAllocSize, 12)
	k := newKit(t, d, ipcAllocSize)
	tests := []struct {
		name     string
		off, len uint64
	}{
		{"whole allocation", 0, ipcAllocSize},
		{"odd sub-range", ipcViewOff, ipcViewLen},
		{"page-aligned sub-range", 65536, 4096},
		{"last byte", ipcAllocSize - 1, 1},
		{"three bytes", 12345, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x, err := d.Export(base + device.Addr(tc.off))
			if err != nil {
				t.Fatal(err)
			}
			r, err := d.ImportRegion(x.Handle, x.Offset, tc.len)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := r.Close(); err != nil {
					t.Error(err)
				}
			}()
			if r.Mapping().Base() == base {
				t.Fatalf("import mapped at the exporter's own address %#x; the fake maps a second view", uint64(base))
			}
			seg, err := r.Seg(0, tc.len)
			if err != nil {
				t.Fatal(err)
			}
			want := data[tc.off : tc.off+tc.len]
			if msg := diff(k.gather(t, []device.Seg{seg}), want); msg != "" {
				t.Fatalf("region bytes: %s", msg)
			}
			if tc.off != 0 {
				// The same copy at the mapping base (the offset dropped)
				// reads other bytes: the test above can fail.
				dropped := k.gather(t, []device.Seg{{Addr: r.Mapping().Base(), Len: tc.len}})
				if diff(dropped, want) == "" {
					t.Fatal("bytes at the mapping base equal the region's: the fake does not model the offset")
				}
			}
			src := pattern(tc.off, int(tc.len))
			k.scatter(t, []device.Seg{seg}, src)
			if msg := diff(readDev(t, d, base+device.Addr(tc.off), int(tc.len)), src); msg != "" {
				t.Fatalf("exporter's view after a Scatter into the import: %s", msg)
			}
			if err := d.CopyHtoD(base, data); err != nil {
				t.Fatal(err)
			}
		})
	}
	if got := hook(t, l, "fakehip_last_ipc_flags"); got != ipcLazyEnablePeer {
		t.Errorf("hipIpcOpenMemHandle flags %d, want LazyEnablePeerAccess (1)", got)
	}
}

// Copies from an imported region into local device memory (the same-node
// XGMI path) move the region's bytes.
func TestCopyDtoDFromImport(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, 0)
	base, data := filled(t, d, ipcAllocSize, 13)
	local, _ := filled(t, d, 8192, 14)
	x, err := d.Export(base + ipcViewOff)
	if err != nil {
		t.Fatal(err)
	}
	r, err := d.ImportRegion(x.Handle, x.Offset, ipcViewLen)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	k := newKit(t, d, 1)
	src, err := r.Seg(ipcWriteOff, 8192)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.s.CopyDtoD(local, src.Addr, src.Len); err != nil {
		t.Fatal(err)
	}
	if err := k.s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	want := data[ipcViewOff+ipcWriteOff : ipcViewOff+ipcWriteOff+8192]
	if msg := diff(readDev(t, d, local, 8192), want); msg != "" {
		t.Errorf("D2D out of the import: %s", msg)
	}
	if err := k.s.CopyDtoD(math.MaxUint64-4, src.Addr, 8); err == nil || !strings.Contains(err.Error(), "range overflows") {
		t.Errorf("CopyDtoD with an overflowing destination: %v", err)
	}
}

func TestImportCache(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, 0)
	a, err := d.AllocDevice(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	x, err := d.Export(a + 4096)
	if err != nil {
		t.Fatal(err)
	}
	h := x.Handle
	state := func(step string, opens, closes, mapped int64) {
		t.Helper()
		if o, c, m := hook(t, l, "fakehip_ipc_opens"), hook(t, l, "fakehip_ipc_closes"), hook(t, l, "fakehip_imports"); o != opens || c != closes || m != mapped {
			t.Fatalf("%s: %d opens, %d closes, %d mapped; want %d, %d, %d", step, o, c, m, opens, closes, mapped)
		}
	}
	m1, err := d.Import(h)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := d.Import(h)
	if err != nil {
		t.Fatal(err)
	}
	r, err := d.ImportRegion(h, x.Offset, 100)
	if err != nil {
		t.Fatal(err)
	}
	state("three imports of one handle", 1, 0, 1)
	if m1.Base() != m2.Base() || r.Mapping().Base() != m1.Base() {
		t.Errorf("imports of one handle at %#x, %#x, %#x: want one base", uint64(m1.Base()), uint64(m2.Base()), uint64(r.Mapping().Base()))
	}
	big := h
	big.Size = h.Size + 1
	if _, err := d.Import(big); !errors.Is(err, device.ErrBadHandle) {
		t.Errorf("claim past the allocation while open: %v, want ErrBadHandle", err)
	}
	if err := d.FreeDevice(a); err == nil {
		t.Fatal("hipFree of an allocation still imported succeeded (the fake should refuse)")
	} else {
		d.core.Mu.Lock()
		d.devMem[a] = 1 << 20 // FreeDevice forgot it; the fake still holds it
		d.core.Mu.Unlock()
	}
	for i, c := range []interface{ Close() error }{m1, r} {
		if err := c.Close(); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
	}
	state("two of three closed", 1, 0, 1)
	if err := m1.Close(); !errors.Is(err, device.ErrClosed) {
		t.Errorf("second Close of one mapping: %v, want ErrClosed", err)
	}
	state("a double close drops no other reference", 1, 0, 1)
	if err := m2.Close(); err != nil {
		t.Fatal(err)
	}
	state("all closed", 1, 1, 0)
	m3, err := d.Import(h)
	if err != nil {
		t.Fatal(err)
	}
	state("imported again", 2, 1, 1)
	if err := m3.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.FreeDevice(a); err != nil {
		t.Fatal(err)
	}
}

func TestImportRejects(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, 0)
	base, _ := filled(t, d, 1<<16, 15)
	x, err := d.Export(base)
	if err != nil {
		t.Fatal(err)
	}
	good := x.Handle
	with := func(f func(h *device.Handle)) device.Handle {
		h := good
		h.Bytes = append([]byte(nil), good.Bytes...)
		f(&h)
		return h
	}
	type window struct{ off, length uint64 }
	tests := []struct {
		name   string
		h      device.Handle
		region *window // ImportRegion of this window; nil: Import
		want   error
		code   int
	}{
		{"memfd", with(func(h *device.Handle) { h.Kind = device.HandleMemfd }), nil, device.ErrNotSupported, 0},
		{"cuda handle", with(func(h *device.Handle) { h.Kind = device.HandleCUDAIPC }), nil, device.ErrNotSupported, 0},
		{"short handle", with(func(h *device.Handle) { h.Bytes = h.Bytes[:63] }), nil, device.ErrBadHandle, 0},
		{"size 0", with(func(h *device.Handle) { h.Size = 0 }), nil, device.ErrBadHandle, 0},
		{"claim past the allocation", with(func(h *device.Handle) { h.Size = 1<<16 + 1 }), nil, device.ErrBadHandle, 0},
		{"not a handle", with(func(h *device.Handle) { clear(h.Bytes) }), nil, nil, codeInvalidValue},
		{"region past the end", good, &window{1<<16 - 10, 11}, ErrOutOfRange, 0},
		{"region offset overflows", good, &window{math.MaxUint64 - 1, 4}, ErrOutOfRange, 0},
		{"region length overflows", good, &window{4, math.MaxUint64}, ErrOutOfRange, 0},
		{"empty region", good, &window{5, 0}, ErrOutOfRange, 0},
		{"region of a bad claim", with(func(h *device.Handle) { h.Size = 1<<16 + 1 }), &window{0, 1<<16 + 1}, device.ErrBadHandle, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.region == nil {
				var m device.Mapping
				if m, err = d.Import(tc.h); err == nil {
					m.Close()
				}
			} else {
				var r *Region
				if r, err = d.ImportRegion(tc.h, tc.region.off, tc.region.length); err == nil {
					r.Close()
				}
			}
			switch {
			case err == nil:
				t.Fatal("accepted")
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Errorf("got %v, want %v", err, tc.want)
			case code(err) != tc.code:
				t.Errorf("got %v, want code %d", err, tc.code)
			}
			if n := hook(t, l, "fakehip_imports"); n != 0 {
				t.Errorf("%d handles left open after the refusal", n)
			}
		})
	}
}

func TestRegionSeg(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, 0)
	base, _ := filled(t, d, 1<<16, 16)
	x, err := d.Export(base + 1000)
	if err != nil {
		t.Fatal(err)
	}
	r, err := d.ImportRegion(x.Handle, x.Offset, 5000)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	mb := r.Mapping().Base()
	tests := []struct {
		off, n uint64
		ok     bool
	}{
		{0, 5000, true},
		{4999, 1, true},
		{17, 100, true},
		{0, 5001, false},
		{5000, 1, false},
		{1, 0, false},
		{math.MaxUint64, 2, false},
		{2, math.MaxUint64, false},
	}
	for _, tc := range tests {
		seg, err := r.Seg(tc.off, tc.n)
		switch {
		case tc.ok && err != nil:
			t.Errorf("Seg(%d, %d): %v", tc.off, tc.n, err)
		case tc.ok && (seg.Addr != mb+device.Addr(1000+tc.off) || seg.Len != tc.n):
			t.Errorf("Seg(%d, %d) = %#x+%d, want base+%d", tc.off, tc.n, uint64(seg.Addr), seg.Len, 1000+tc.off)
		case !tc.ok && !errors.Is(err, ErrOutOfRange):
			t.Errorf("Seg(%d, %d): %v, want ErrOutOfRange", tc.off, tc.n, err)
		}
	}
}

// Cross-process: the test binary re-executes itself as a child (the
// "sidecar") that imports a sub-range of memory the parent (the "engine")
// exported. They talk over a SOCK_SEQPACKET socketpair, the child's end at
// fd 3.

const (
	childEnv = "STAGE_TEST_HIP_CHILD"
	// childLibraryEnv names the emulation the child opens (a test-only
	// switch, never a config key).
	childLibraryEnv = "STAGE_TEST_HIP_LIBRARY"
	childFD         = 3
)

func TestIPCOtherProcess(t *testing.T) {
	so := buildFake(t)
	l := openFake(t, so)
	d := openDev(t, l, 0)
	seed := uint64(time.Now().UnixNano())
	base, data := filled(t, d, ipcAllocSize, seed)
	x, err := d.Export(base + ipcViewOff)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	parentEnd, childEnd := os.NewFile(uintptr(pair[0]), "parent"), os.NewFile(uintptr(pair[1]), "child")
	defer parentEnd.Close()
	var out strings.Builder
	cmd := exec.Command(os.Args[0], "-test.run=^TestIPCChildHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1", childLibraryEnv+"="+so)
	cmd.ExtraFiles = []*os.File{childEnd}
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	childEnd.Close()
	req := fmt.Sprintf("%s %d %d %d", hex.EncodeToString(x.Handle.Bytes), x.Offset, x.Handle.Size, seed)
	if _, err := parentEnd.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	parentEnd.SetReadDeadline(time.Now().Add(60 * time.Second))
	n, rerr := parentEnd.Read(buf)
	if rerr != nil {
		cmd.Process.Kill()
	}
	werr := cmd.Wait()
	if rerr != nil || string(buf[:n]) != "ok" || werr != nil {
		t.Fatalf("child: reply %q (%v), exit %v\n%s", buf[:n], rerr, werr, out.String())
	}
	want := append([]byte(nil), data...)
	copy(want[ipcViewOff+ipcWriteOff:], pattern(seed^1, ipcWriteLen))
	if msg := diff(readDev(t, d, base, ipcAllocSize), want); msg != "" {
		t.Fatalf("allocation after the child's Scatter: %s (the write landed in the wrong place?)", msg)
	}
	// filled's cleanup frees the allocation; the fake refuses while the
	// child's import is still counted, so a child that did not close fails.
}

// TestIPCChildHelper is the child of TestIPCOtherProcess; it skips unless
// started by it.
func TestIPCChildHelper(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("helper process of TestIPCOtherProcess")
	}
	reply := func(msg string) {
		if _, err := syscall.Write(childFD, []byte(msg)); err != nil {
			t.Fatalf("child write: %v", err)
		}
	}
	buf := make([]byte, 4096)
	n, err := syscall.Read(childFD, buf)
	if err != nil {
		t.Fatal(err)
	}
	var hexHandle string
	var off, size, seed uint64
	if _, err := fmt.Sscanf(string(buf[:n]), "%s %d %d %d", &hexHandle, &off, &size, &seed); err != nil {
		reply(err.Error())
		t.Fatal(err)
	}
	handle, err := hex.DecodeString(hexHandle)
	if err == nil {
		err = childWork(t, device.Handle{Kind: device.HandleHIPIPC, Bytes: handle, Size: size, FD: -1}, off, seed)
	}
	if err != nil {
		reply(err.Error())
		t.Fatal(err)
	}
	reply("ok")
}

// childWork imports the region twice (one handle open), gathers it in
// three blocks out of order, copies part of it device to device, and
// scatters new bytes into it.
func childWork(t *testing.T, h device.Handle, off, seed uint64) error {
	d, err := OpenDevice(0, Config{Library: os.Getenv(childLibraryEnv), Logf: t.Logf})
	if err != nil {
		return err
	}
	t.Cleanup(func() { // after newKit's cleanup
		if err := d.Close(); err != nil {
			t.Errorf("child: Device.Close: %v", err)
		}
		if n, _ := d.lib.Call("fakehip_live"); n != 0 {
			t.Errorf("child: the fake holds %d resources after the test", n)
		}
	})
	r, err := d.ImportRegion(h, off, ipcViewLen)
	if err != nil {
		return err
	}
	defer r.Close()
	w, err := d.ImportRegion(h, off+ipcWriteOff, ipcWriteLen)
	if err != nil {
		return err
	}
	defer w.Close()
	if n, _ := d.lib.Call("fakehip_ipc_opens"); n != 1 {
		return fmt.Errorf("two regions of one allocation opened its handle %d times, want 1", n)
	}
	data := pattern(seed, ipcAllocSize)[off : off+ipcViewLen]
	k := newKit(t, d, ipcViewLen)
	var segs []device.Seg
	for _, b := range [][2]uint64{{2 << 20, ipcViewLen - 2<<20}, {1 << 20, 1 << 20}, {0, 1 << 20}} {
		s, err := r.Seg(b[0], b[1])
		if err != nil {
			return err
		}
		segs = append(segs, s)
	}
	want := append(append(append([]byte(nil), data[2<<20:]...), data[1<<20:2<<20]...), data[:1<<20]...)
	if msg := diff(k.gather(t, segs), want); msg != "" {
		return fmt.Errorf("child: gathered region: %s (import offset lost?)", msg)
	}
	ws, err := w.Seg(0, ipcWriteLen)
	if err != nil {
		return err
	}
	k.scatter(t, []device.Seg{ws}, pattern(seed^1, ipcWriteLen))
	return nil
}
