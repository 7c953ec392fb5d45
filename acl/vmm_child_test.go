package acl

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/devicetest"
)

// Cross-process VMM tests: the test process is the engine (AllocVMM,
// ExportVMM); the child of child_test.go is the sidecar, asked to import
// ("import"), close and count.

const (
	vmmGranularity = 65536
	vmmScatterLen  = 4096 + 7
)

// vmmChildImport is the child's "import" request.
func vmmChildImport(d *Device, f []string) (device.Mapping, error) {
	b, err := hex.DecodeString(f[0])
	if err != nil {
		return nil, err
	}
	size, _ := strconv.ParseUint(f[1], 10, 64)
	seed, _ := strconv.ParseUint(f[2], 10, 64)
	off, _ := strconv.ParseUint(f[3], 10, 64)
	m, err := d.Import(device.Handle{Kind: device.HandleACLVMM, Bytes: b, Size: size, FD: -1})
	if err != nil {
		return nil, err
	}
	got := make([]byte, size)
	if err := d.CopyDtoH(got, m.Base()); err != nil {
		m.Close()
		return nil, err
	}
	want := devicetest.RandBytes(seed, int(off+size))[off:]
	if i := devicetest.Mismatch(got, want); i >= 0 {
		m.Close()
		return nil, fmt.Errorf("region byte %d is %#02x, want %#02x", i, got[i], want[i])
	}
	// Scatter through a stream, as transfers do.
	s, err := d.NewStream()
	if err != nil {
		m.Close()
		return nil, err
	}
	defer s.Close()
	n := min(size, vmmScatterLen)
	p, err := d.AllocPinned(int(n))
	if err != nil {
		m.Close()
		return nil, err
	}
	defer d.FreePinned(p)
	copy(p.Host(), devicetest.RandBytes(seed^1, int(n)))
	err = s.Scatter([]device.Seg{{Addr: m.Base(), Len: n}}, p)
	if err == nil {
		err = s.Synchronize()
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// vmmEngine allocates chunks of VMM memory filled with RandBytes(seed).
func vmmEngine(t *testing.T, d *Device, seed uint64, chunks ...uint64) device.Addr {
	t.Helper()
	base, err := d.AllocVMM(chunks)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.FreeVMM(base); err != nil {
			t.Errorf("FreeVMM: %v", err)
		}
	})
	var total uint64
	for _, n := range chunks {
		total += n
	}
	if err := d.CopyHtoD(base, devicetest.RandBytes(seed, int(total))); err != nil {
		t.Fatal(err)
	}
	return base
}

func setVMMEnv(t *testing.T) {
	t.Setenv("FAKEACL_GRANULARITY", strconv.Itoa(vmmGranularity))
}

// TestVMMImport: one chunk; many chunks with the region starting inside
// the first and sharing chunks with the first region (imported once,
// mapped twice); the bytes gathered and scattered exactly; a chunk not
// whitelisted for the sidecar's BareTgid refused; failures partway (a
// refused second chunk, a chunk whose claimed size the runtime refuses to
// map) undo everything; after close nothing is left mapped or imported.
func TestVMMImport(t *testing.T) {
	setVMMEnv(t)
	so := buildFake(t)
	vmmImportCase(t, so, openFakeSO(t, so, true))
}

// vmmImportCase is TestVMMImport over the library so (fakeacl or, in the
// gpu tests, fakeacl_cuda), chunks of the runtime's granularity.
func vmmImportCase(t *testing.T, so string, l *Library) {
	d := openDev(t, l, Config{})
	g, err := d.VMMGranularity()
	if err != nil {
		t.Fatal(err)
	}
	gi := int(g)
	seed := uint64(time.Now().UnixNano())
	base := vmmEngine(t, d, seed, g, g, g, g, g)
	other := vmmEngine(t, d, seed+1, g)
	third := vmmEngine(t, d, seed+2, g)
	c := startChild(t, so, 0, CopyAuto, "FAKEACL_TGID_OFFSET=1000")
	child := c.pid() + 1000 // the child's BareTgid: not its pid

	one, err := d.ExportVMM(base, g, child)
	if err != nil {
		t.Fatal(err)
	}
	off, n := g/2+3, 3*g+100
	many, err := d.ExportVMM(base+device.Addr(off), n, child)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := DecodeVMM(many.Bytes, many.Size)
	if v.Offset != off || len(v.Chunks) != 4 || v.Chunks[0] != (VMMChunk{mustDecode(t, one).Chunks[0].Shareable, g}) {
		t.Fatalf("ExportVMM(base+%d, %d B) = %+v; want offset %d in 4 chunks, the first the one chunk's", off, n, v, off)
	}
	if r := c.importReq(one, seed, 0); r != "ok" {
		t.Fatalf("one chunk: %s", r)
	}
	// The first import scattered over the region's start; the engine puts
	// the bytes back for the second to check.
	got := make([]byte, 5*gi)
	if err := d.CopyDtoH(got, base); err != nil {
		t.Fatal(err)
	}
	want := devicetest.RandBytes(seed, 5*gi)
	if i := devicetest.Mismatch(got[:vmmScatterLen], devicetest.RandBytes(seed^1, vmmScatterLen)); i >= 0 {
		t.Fatalf("one chunk: engine byte %d is not what the child scattered", i)
	}
	if err := d.CopyHtoD(base, want); err != nil {
		t.Fatal(err)
	}
	if r := c.importReq(many, seed, off); r != "ok" {
		t.Fatalf("many chunks from offset %d: %s", off, r)
	}
	if r := c.ask("count"); r != "maps 5 chunks 4 mappings 2 live "+liveOf(r) {
		t.Errorf("two regions over 4 chunks: %s; want 5 maps of 4 chunks imported once", r)
	}
	if err := d.CopyDtoH(got, base); err != nil {
		t.Fatal(err)
	}
	copy(want[off:], devicetest.RandBytes(seed^1, vmmScatterLen))
	if i := devicetest.Mismatch(got, want); i >= 0 {
		t.Fatalf("engine byte %d is %#02x after the child's scatter, want %#02x", i, got[i], want[i])
	}
	baseline := c.ask("count")

	// Whitelisted for someone else (the child's pid, not its BareTgid).
	wrong, err := d.ExportVMM(other, g, c.pid())
	if err != nil {
		t.Fatal(err)
	}
	if r := c.importReq(wrong, seed+1, 0); !strings.Contains(r, "NO_PERMISSION") || !strings.Contains(r, "BareTgid") {
		t.Errorf("import of a chunk not whitelisted for the child's BareTgid: %s", r)
	}
	// Partway: a good chunk, then the refused one.
	v2 := VMMHandle{PhysDevice: -1, Chunks: []VMMChunk{v.Chunks[3], mustDecode(t, wrong).Chunks[0]}}
	if r := c.importReq(device.Handle{Kind: device.HandleACLVMM, Bytes: v2.Encode(), Size: g + 1}, 0, 0); !strings.Contains(r, "NO_PERMISSION") {
		t.Errorf("second chunk refused: %s", r)
	}
	// Partway: a chunk already imported, claimed with another size.
	v3 := VMMHandle{PhysDevice: -1, Chunks: []VMMChunk{v.Chunks[1], {Shareable: v.Chunks[2].Shareable, Size: 2 * g}}}
	if r := c.importReq(device.Handle{Kind: device.HandleACLVMM, Bytes: v3.Encode(), Size: 2 * g}, 0, 0); !strings.Contains(r, "claimed") {
		t.Errorf("chunk claimed with another size: %s", r)
	}
	// Partway: a new chunk claimed larger than it is: imported, then the
	// runtime refuses to map it (aclrtMapMem wants the physical size).
	fresh, err := d.ExportVMM(third, g, child)
	if err != nil {
		t.Fatal(err)
	}
	v4 := VMMHandle{PhysDevice: -1, Chunks: []VMMChunk{v.Chunks[0], {Shareable: mustDecode(t, fresh).Chunks[0].Shareable, Size: 2 * g}}}
	if r := c.importReq(device.Handle{Kind: device.HandleACLVMM, Bytes: v4.Encode(), Size: 3 * g}, 0, 0); !strings.Contains(r, "aclrtMapMem") {
		t.Errorf("chunk of a wrong size: %s", r)
	}
	if r := c.ask("count"); r != baseline {
		t.Errorf("after the refused imports: %s; want %s (all undone)", r, baseline)
	}
	if r := c.ask("close"); r != "ok" {
		t.Fatal(r)
	}
	if r := c.ask("count"); !strings.HasPrefix(r, "maps 0 chunks 0 mappings 0 ") {
		t.Errorf("after close: %s; want nothing mapped or imported", r)
	}
	c.finish()
}

func liveOf(r string) string { return r[strings.LastIndex(r, " ")+1:] }

func mustDecode(t *testing.T, h device.Handle) VMMHandle {
	t.Helper()
	v, err := DecodeVMM(h.Bytes, h.Size)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestVMMImportOtherDevice: memory of physical NPU 1 registered with a
// sidecar of NPU 0 is refused by id, or, when the engine could not say its
// id, by the probe copy; both errors name the devices and what to do. With
// ASCEND_RT_VISIBLE_DEVICES the sidecar's ordinal 1 is that NPU and the
// import works.
func TestVMMImportOtherDevice(t *testing.T) {
	setVMMEnv(t)
	t.Setenv("FAKEACL_DEVICES", "2")
	so := buildFake(t)
	l := openFakeSO(t, so, true)
	d := openDev1(t, l)
	const g = vmmGranularity
	seed := uint64(time.Now().UnixNano())
	base := vmmEngine(t, d, seed, g, g)
	c := startChild(t, so, 0, CopyAuto)
	h, err := d.ExportVMM(base+5, g, c.pid())
	if err != nil {
		t.Fatal(err)
	}
	if r := c.importReq(h, seed, 5); !strings.Contains(r, "physical NPU 1") || !strings.Contains(r, "device.ordinal 0 (physical NPU 0)") || !strings.Contains(r, "one acl sidecar per NPU") {
		t.Errorf("import of NPU 1's memory on NPU 0: %s", r)
	}
	v := mustDecode(t, h)
	v.PhysDevice = -1
	if r := c.importReq(device.Handle{Kind: device.HandleACLVMM, Bytes: v.Encode(), Size: h.Size}, seed, 5); !strings.Contains(r, "probe") || !strings.Contains(r, "one acl sidecar per NPU") {
		t.Errorf("import of NPU 1's memory, id unknown, on NPU 0: %s", r)
	}
	if r := c.ask("count"); !strings.HasPrefix(r, "maps 0 chunks 0 mappings 0 ") {
		t.Errorf("after the refusals: %s; want nothing left", r)
	}
	c.finish()

	// The same NPU, as the sidecar numbers it under ASCEND_RT_VISIBLE_DEVICES.
	c = startChild(t, so, 1, CopyAuto, "ASCEND_RT_VISIBLE_DEVICES=0,1")
	if _, err := d.ExportVMM(base+5, g, c.pid()); err != nil {
		t.Fatal(err)
	}
	if r := c.importReq(h, seed, 5); r != "ok" {
		t.Errorf("import on the same physical NPU: %s", r)
	}
	if r := c.ask("close"); r != "ok" {
		t.Fatal(r)
	}
	c.finish()
}

func openDev1(t *testing.T, l *Library) *Device {
	t.Helper()
	d, err := l.OpenDevice(1, Config{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}
