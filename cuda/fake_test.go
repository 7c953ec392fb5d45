package cuda

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/devicetest"
)

// These tests drive the whole Go and C path against testdata/fakecuda.c, a
// libcuda stand-in where device memory is host memory. They run in CI.

const fakePTX = "// fake module\n.visible .entry stage_copy_segments(\n"

func fakeLibrary(t *testing.T, flags ...string) *Library {
	t.Helper()
	return fakeLibraryLeaks(t, true, flags...)
}

// fakeLibraryLeaks builds and opens the fake; with checkLeaks, the test
// fails if the fake still holds anything at cleanup.
func fakeLibraryLeaks(t *testing.T, checkLeaks bool, flags ...string) *Library {
	t.Helper()
	src, err := os.ReadFile("testdata/fakecuda.c")
	if err != nil {
		t.Fatal(err)
	}
	so := buildSO(t, string(src), flags...)
	l, err := OpenLibrary(so)
	if err != nil {
		t.Fatalf("OpenLibrary(fake): %v", err)
	}
	t.Cleanup(func() {
		if n, err := l.Call("fake_live"); checkLeaks && (err != nil || n != 0) {
			t.Errorf("fake libcuda: %d resources still live after the test (%v)", n, err)
		}
		l.Close()
	})
	return l
}

func openFake(t *testing.T, l *Library, cfg Config) *Device {
	t.Helper()
	d, err := l.OpenDevice(0, cfg)
	if err != nil {
		t.Fatalf("OpenDevice(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

func TestFakeOpen(t *testing.T) {
	l := fakeLibrary(t)
	if !l.HasBatchCopy() || l.HasVMM() {
		t.Errorf("batch %v vmm %v, want batch and no VMM", l.HasBatchCopy(), l.HasVMM())
	}
	abs := l.Absent()
	if _, ok := abs["cuMemCreate"]; !ok {
		t.Errorf("Absent() = %v, want cuMemCreate recorded", abs)
	}
	if _, ok := abs["cuMemcpyBatchAsync_v2"]; ok {
		t.Error("cuMemcpyBatchAsync_v2 recorded absent")
	}
	if v, err := l.DriverVersion(); err != nil || v != 13000 {
		t.Errorf("DriverVersion = %d, %v", v, err)
	}
	// The embedded module (kernels/gather.ptx) declares the kernel's entry.
	d0 := openFake(t, l, Config{})
	if m, why := d0.CopyMode(); m != CopyKernel {
		t.Errorf("embedded PTX: copy mode %q (%s), want kernel", m, why)
	}
	d := openFake(t, l, Config{PTX: fakePTX})
	if m, why := d.CopyMode(); m != CopyKernel {
		t.Errorf("copy mode %q (%s), want kernel", m, why)
	}
	if d.String() != "cuda:0" || d.Name() != "Fake GPU" || d.Multiprocessors() != 4 {
		t.Errorf("device %s %q sms %d", d, d.Name(), d.Multiprocessors())
	}
	if _, err := l.OpenDevice(1, Config{}); err == nil || !strings.Contains(err.Error(), "sees 1 CUDA devices") {
		t.Errorf("ordinal 1: got %v", err)
	}
}

func TestFakeCopyModeFallbacks(t *testing.T) {
	l := fakeLibrary(t)
	d := openFake(t, l, Config{PTX: "not ptx"})
	if m, why := d.CopyMode(); m != CopyBatch || !strings.Contains(why, "CUDA_ERROR_INVALID_PTX") {
		t.Errorf("bad PTX: copy mode %q (%s), want batch naming CUDA_ERROR_INVALID_PTX", m, why)
	}
	_, err := l.OpenDevice(0, Config{PTX: "not ptx", CopyMode: CopyKernel})
	if !errors.Is(err, device.ErrNotSupported) {
		t.Errorf("kernel mode with bad PTX: got %v, want ErrNotSupported", err)
	}
	d2 := openFake(t, l, Config{CopyMode: CopyPerCopy})
	if m, _ := d2.CopyMode(); m != CopyPerCopy {
		t.Errorf("copy_mode percopy: mode %q", m)
	}
	if _, err := l.OpenDevice(0, Config{CopyMode: "fast"}); err == nil || !strings.Contains(err.Error(), `copy mode "fast"`) {
		t.Errorf("copy mode fast: got %v, want an error naming it", err)
	}
	ptx := filepath.Join(t.TempDir(), "gather.ptx")
	if err := os.WriteFile(ptx, []byte(fakePTX), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, why := openFake(t, l, Config{PTXFile: ptx}).CopyMode(); m != CopyKernel {
		t.Errorf("PTXFile: copy mode %q (%s), want kernel", m, why)
	}
	d4 := openFake(t, l, Config{PTXFile: ptx + ".gone"})
	if m, why := d4.CopyMode(); m != CopyBatch || !strings.Contains(why, "device.cuda.ptx: ") {
		t.Errorf("missing PTXFile: copy mode %q (%s), want batch naming device.cuda.ptx", m, why)
	}

	nb := fakeLibrary(t, "-DFAKE_NO_BATCH")
	if nb.HasBatchCopy() {
		t.Fatal("library without cuMemcpyBatchAsync reports batch copies")
	}
	d3 := openFake(t, nb, Config{PTX: "not ptx"})
	if m, why := d3.CopyMode(); m != CopyPerCopy || !strings.Contains(why, "batch unavailable") {
		t.Errorf("no kernel, no batch: mode %q (%s), want percopy", m, why)
	}
	if _, err := nb.OpenDevice(0, Config{CopyMode: CopyBatch}); !errors.Is(err, device.ErrNotSupported) {
		t.Errorf("batch mode without the symbol: got %v, want ErrNotSupported", err)
	}
}

func TestFakeInitError(t *testing.T) {
	t.Setenv("FAKECUDA_INIT_ERR", "100")
	l := fakeLibrary(t)
	_, err := l.OpenDevice(0, Config{})
	want := "cuda: cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}

// TestFakeConformance runs the device conformance suite in every copy
// mode, strided kernel included: each must move every layout byte-exact,
// from any thread (the fake counts how often a context was made current).
func TestFakeConformance(t *testing.T) {
	for _, mode := range []CopyMode{CopyKernel, CopyBatch, CopyPerCopy} {
		t.Run(string(mode), func(t *testing.T) {
			l := fakeLibrary(t)
			d := openFake(t, l, Config{CopyMode: mode, PTX: fakeStridedPTX})
			devicetest.Run(t, d, d, devicetest.Options{Workers: 8})
			if n, _ := l.Call("fake_launches"); mode == CopyKernel && n == 0 {
				t.Error("kernel mode launched no kernel")
			}
			if n, _ := l.Call("fake_ctx_sets"); n < 2 {
				t.Errorf("context made current %d times across 8 fresh threads", n)
			}
		})
	}
}

func TestFakeRingUnderPressure(t *testing.T) {
	t.Setenv("FAKECUDA_PENDING", "3") // each event says NOT_READY three times
	l := fakeLibrary(t)
	d := openFake(t, l, Config{CopyMode: CopyKernel, PTX: fakePTX})
	const poolSize = 1 << 20
	pool, err := d.AllocDevice(poolSize)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreeDevice(pool)
	data := devicetest.RandBytes(9, poolSize)
	if err := d.CopyHtoD(pool, data); err != nil {
		t.Fatal(err)
	}
	s, err := d.NewCUDAStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := d.AllocPinned(64 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreePinned(p)
	rng := rand.New(rand.NewPCG(10, 11))
	// 3*ringMaxSlots launches without synchronizing: slots must be made up
	// to the cap and then waited for, never overwritten while "running".
	for i := range 3 * ringMaxSlots {
		segs := devicetest.BlockSegs(rng, pool, poolSize, 4, 1024)
		dst := p.Slice((i%64)*4096, 4096)
		if err := s.Gather(dst, segs); err != nil {
			t.Fatalf("gather %d: %v", i, err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		for k, sg := range segs {
			off := sg.Addr - pool
			if string(dst.Host()[k*1024:(k+1)*1024]) != string(data[off:off+1024]) {
				t.Fatalf("gather %d segment %d differs", i, k)
			}
		}
	}
	if s.ring.made > ringMaxSlots {
		t.Fatalf("%d ring slots made, cap %d", s.ring.made, ringMaxSlots)
	}
	ev, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	if err := s.Record(ev); err != nil {
		t.Fatal(err)
	}
	if done, err := ev.Query(); done || err != nil {
		t.Fatalf("first Query = (%v, %v), want not ready", done, err)
	}
	if err := ev.Wait(); err != nil {
		t.Fatal(err)
	}
	if done, err := ev.Query(); !done || err != nil {
		t.Fatalf("Query after Wait = (%v, %v)", done, err)
	}
}

func TestFakeIPCImportKeepsOffset(t *testing.T) {
	l := fakeLibrary(t)
	d := openFake(t, l, Config{PTX: fakePTX})
	base, err := d.AllocDevice(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreeDevice(base)
	view := base + 12345
	x, err := d.Export(view)
	if err != nil {
		t.Fatal(err)
	}
	off, size := x.Offset, x.Handle.Size
	if x.Base != base || off != 12345 || size != 1<<20 || x.Handle.Kind != device.HandleCUDAIPC || len(x.Handle.Bytes) != 64 {
		t.Fatalf("Export(base+12345) = base %#x off %d size %d handle %s of %d B, want %#x 12345 %d cuda-ipc of 64 B",
			x.Base, off, size, x.Handle.Kind, len(x.Handle.Bytes), base, 1<<20)
	}
	m, err := d.Import(x.Handle)
	if err != nil {
		t.Fatal(err)
	}
	if m.Base()+device.Addr(off) != view || m.Size() != size {
		t.Errorf("mapping base %#x + %d != view %#x (size %d)", m.Base(), off, view, m.Size())
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); !errors.Is(err, device.ErrClosed) {
		t.Errorf("second Close: %v, want ErrClosed", err)
	}
}

func TestFakeBadInput(t *testing.T) {
	l := fakeLibrary(t)
	d := openFake(t, l, Config{PTX: fakePTX})
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := d.AllocPinned(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreePinned(p)
	if err := s.Gather(p, []device.Seg{{Addr: 0x1000, Len: 100}}); err == nil || !strings.Contains(err.Error(), "add up to 100 B, pinned buffer is 4096 B") {
		t.Errorf("short segments: %v", err)
	}
	if err := s.Gather(p.Slice(0, 2), []device.Seg{{Addr: ^device.Addr(0), Len: 2}}); err == nil || !strings.Contains(err.Error(), "overflows") {
		t.Errorf("wrapping segment: %v", err)
	}
	if err := d.FreePinned(p.Slice(0, 100)); err == nil || !strings.Contains(err.Error(), "whole buffer") {
		t.Errorf("FreePinned of a slice: %v", err)
	}
	if err := d.UnregisterHost(p); err == nil || !strings.Contains(err.Error(), "use FreePinned") {
		t.Errorf("UnregisterHost of AllocPinned memory: %v", err)
	}
	for _, tc := range []struct {
		h    device.Handle
		want error
	}{
		{device.Handle{Kind: device.HandleCUDAIPC, Bytes: make([]byte, 10), Size: 4096}, device.ErrBadHandle},
		{device.Handle{Kind: device.HandleCUDAIPC, Bytes: make([]byte, 64)}, device.ErrBadHandle},
		{device.Handle{Kind: device.HandlePosixFD, FD: 3, Size: 4096}, device.ErrNotSupported}, // fake has no VMM
		{device.Handle{Kind: device.HandleACLKey, Bytes: []byte("k"), Size: 4096}, device.ErrNotSupported},
	} {
		if _, err := d.Import(tc.h); !errors.Is(err, tc.want) {
			t.Errorf("Import(%s, %d bytes, size %d): got %v, want %v", tc.h.Kind, len(tc.h.Bytes), tc.h.Size, err, tc.want)
		}
	}
	if _, err := d.VMMAlloc(1 << 20); !errors.Is(err, device.ErrNotSupported) {
		t.Errorf("VMMAlloc without VMM symbols: %v", err)
	}
	// An event of another device is refused.
	d2 := openFake(t, l, Config{PTX: fakePTX})
	ev, err := d2.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	if err := s.Record(ev); err == nil {
		t.Error("Record of another device's event succeeded")
	}
}

func TestFakeCloseReportsLeaks(t *testing.T) {
	l := fakeLibraryLeaks(t, false) // the leaked objects stay in the fake
	d, err := l.OpenDevice(0, Config{PTX: fakePTX})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := d.NewStream()
	ev, _ := d.NewEvent()
	p, _ := d.AllocPinned(100)
	a, _ := d.AllocDevice(100)
	err = d.Close()
	want := "cuda: cuda:0: Close with resources still open: 1 stream, 1 event, 1 pinned buffer, 1 device allocation"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	for name, e := range map[string]error{"stream": s.Close(), "event": ev.Close(), "pinned": d.FreePinned(p), "device": d.FreeDevice(a), "close": d.Close()} {
		if !errors.Is(e, device.ErrClosed) {
			t.Errorf("%s after device Close: %v, want ErrClosed", name, e)
		}
	}
}

func TestFakeRegisterHost(t *testing.T) {
	l := fakeLibrary(t)
	d := openFake(t, l, Config{PTX: fakePTX})
	b := make([]byte, 8192) // the fake does not care that this is Go memory
	p, err := d.RegisterHost(b)
	if err != nil {
		t.Fatal(err)
	}
	if p.DeviceAddr() == 0 || p.Len() != len(b) {
		t.Errorf("registered view: dev %#x len %d", p.DeviceAddr(), p.Len())
	}
	if err := d.FreePinned(p); err == nil || !strings.Contains(err.Error(), "use UnregisterHost") {
		t.Errorf("FreePinned of registered memory: %v", err)
	}
	if err := d.UnregisterHost(p); err != nil {
		t.Fatal(err)
	}
}

// fakeStridedPTX declares both kernels, as gather.ptx does.
const fakeStridedPTX = fakePTX + ".visible .entry stage_copy_strided(\n"

// TestFakeStrided: with the strided kernel in the module, segment lists
// that compress (HND-like rows, aligned or not, pieces of any length) go
// to it and move byte-exact; lists that barely compress (scattered 16 KiB
// blocks) and modules without it keep the plain kernel.
func TestFakeStrided(t *testing.T) {
	l := fakeLibrary(t)
	d := openFake(t, l, Config{CopyMode: CopyKernel, PTX: fakeStridedPTX})
	if d.fnStrided == nil {
		t.Fatal("strided kernel not loaded")
	}
	const poolSize = 8 << 20
	pool, err := d.AllocDevice(poolSize)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreeDevice(pool)
	data := devicetest.RandBytes(21, poolSize)
	if err := d.CopyHtoD(pool, data); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(22, 23))
	launches := func() int64 { n, _ := l.Call("fake_strided_launches"); return int64(n) }
	cases := stridedCases(rng, pool, poolSize)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := launches()
			devicetest.CheckGatherScatter(t, d, d, pool, data, tc.segs, uint64(30+i))
			if got := launches() > before; got != tc.strided {
				t.Errorf("strided kernel launched: %v, want %v", got, tc.strided)
			}
		})
	}

	plain := openFake(t, l, Config{CopyMode: CopyKernel, PTX: fakePTX})
	if m, why := plain.CopyMode(); m != CopyKernel || plain.fnStrided != nil || !strings.Contains(why, "stage_copy_strided") {
		t.Errorf("module without the strided kernel: mode %q (%s), strided %v", m, why, plain.fnStrided != nil)
	}
	before := launches()
	devicetest.CheckGatherScatter(t, plain, plain, pool, data, hndSegs(rng, pool, poolSize, 4, 16, 8, 256, 0), 40)
	if launches() != before {
		t.Error("a module without the strided kernel launched it")
	}
}
