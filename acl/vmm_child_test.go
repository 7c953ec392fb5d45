package acl

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/devicetest"
)

// Cross-process VMM tests: the test process is the engine (AllocVMM,
// ExportVMM); a child re-executed from the test binary is the sidecar. The
// parent sends one request per message on a SOCK_SEQPACKET pair:
//
//	import HEX SIZE SEED OFF   import the handle, gather its SIZE bytes and
//	                           compare them with RandBytes(SEED)[OFF:], then
//	                           scatter RandBytes(SEED^1) over its first bytes
//	                           (kept open until close)
//	close                      close every open mapping, newest first
//	count                      "maps M chunks C mappings N live L"
//
// and the child answers "ok", "err TEXT" or the count.

const (
	vmmChildEnv    = "STAGE_ACL_TEST_VMM_CHILD"
	vmmOrdinalEnv  = "STAGE_ACL_TEST_VMM_ORDINAL"
	vmmGranularity = 65536
	vmmScatterLen  = 4096 + 7
)

type vmmChild struct {
	t    *testing.T
	end  *os.File
	cmd  *exec.Cmd
	out  bytes.Buffer
	done bool
}

func startVMMChild(t *testing.T, so string, ordinal int, env ...string) *vmmChild {
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &vmmChild{t: t, end: os.NewFile(uintptr(pair[0]), "parent")}
	childEnd := os.NewFile(uintptr(pair[1]), "child")
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestVMMChildHelper$", "-test.v", "-test.count=1")
	c.cmd.Env = append(append(os.Environ(), vmmChildEnv+"=1", testLibraryEnv+"="+so, vmmOrdinalEnv+"="+strconv.Itoa(ordinal)), env...)
	c.cmd.ExtraFiles = []*os.File{childEnd}
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	childEnd.Close()
	t.Cleanup(func() {
		c.end.Close()
		if !c.done {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	})
	return c
}

func (c *vmmChild) pid() int32 { return int32(c.cmd.Process.Pid) }

func (c *vmmChild) ask(req string) string {
	c.t.Helper()
	if _, err := c.end.Write([]byte(req)); err != nil {
		c.t.Fatalf("to child: %v\n%s", err, c.out.String())
	}
	buf := make([]byte, 8192)
	c.end.SetReadDeadline(time.Now().Add(60 * time.Second))
	n, err := c.end.Read(buf)
	if err != nil {
		c.t.Fatalf("child's answer to %.40q: %v\n%s", req, err, c.out.String())
	}
	return string(buf[:n])
}

func (c *vmmChild) importReq(h device.Handle, seed, off uint64) string {
	return c.ask(fmt.Sprintf("import %s %d %d %d", hex.EncodeToString(h.Bytes), h.Size, seed, off))
}

// finish ends the child and checks it exited cleanly.
func (c *vmmChild) finish() {
	c.t.Helper()
	c.end.Close()
	err := c.cmd.Wait()
	c.done = true
	if err != nil {
		c.t.Fatalf("child: %v\n%s", err, c.out.String())
	}
}

// TestVMMChildHelper is the sidecar of the VMM tests; it skips unless
// started by one.
func TestVMMChildHelper(t *testing.T) {
	if os.Getenv(vmmChildEnv) == "" {
		t.Skip("helper process of the VMM tests")
	}
	ordinal, _ := strconv.Atoi(os.Getenv(vmmOrdinalEnv))
	d, err := OpenDevice(ordinal, Config{Library: os.Getenv(testLibraryEnv), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	var open []device.Mapping
	defer func() {
		for i := len(open) - 1; i >= 0; i-- {
			open[i].Close()
		}
		if err := d.Close(); err != nil {
			t.Errorf("child Close: %v", err)
		}
	}()
	buf := make([]byte, 1<<17)
	for {
		n, err := syscall.Read(childFD, buf)
		if err != nil || n == 0 {
			return
		}
		f := strings.Fields(string(buf[:n]))
		var reply string
		switch f[0] {
		case "import":
			m, err := vmmChildImport(d, f[1:])
			if err != nil {
				reply = "err " + err.Error()
			} else {
				open = append(open, m)
				reply = "ok"
			}
		case "close":
			reply = "ok"
			for i := len(open) - 1; i >= 0; i-- {
				if err := open[i].Close(); err != nil {
					reply = "err " + err.Error()
				}
			}
			open = nil
		case "count":
			maps, _ := d.lib.Call("fakeacl_vmm_maps")
			live, _ := d.lib.Call("fakeacl_live")
			d.vmmMu.Lock()
			chunks := len(d.chunks)
			d.vmmMu.Unlock()
			d.Mu.Lock()
			mappings := d.Mappings
			d.Mu.Unlock()
			reply = fmt.Sprintf("maps %d chunks %d mappings %d live %d", maps, chunks, mappings, live)
		}
		if _, err := syscall.Write(childFD, []byte(reply)); err != nil {
			t.Fatal(err)
		}
	}
}

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
	c := startVMMChild(t, so, 0, "FAKEACL_TGID_OFFSET=1000")
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
	c := startVMMChild(t, so, 0)
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
	c = startVMMChild(t, so, 1, "ASCEND_RT_VISIBLE_DEVICES=0,1")
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
