//go:build gpu

package cuda

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
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

// Cross-process tests: the test binary re-executes itself as a child (an
// "engine") that allocates device memory and shares it; the parent (the
// "sidecar") imports it and moves bytes. They talk over a SOCK_SEQPACKET
// socketpair, the child's end at fd 3; POSIX fds travel with SCM_RIGHTS.

const (
	childRoleEnv = "STAGE_CUDA_TEST_CHILD"
	childSeedEnv = "STAGE_CUDA_TEST_SEED"
	childFD      = 3

	ipcAllocSize = 8 << 20
	ipcViewOff   = 1_000_003 // odd: the view is a sub-allocation
	ipcViewLen   = 3<<20 + 5
	writeOff     = 2_000_001
	writeLen     = 1<<20 + 3
)

// TestGPUChildHelper is the child process; it skips unless started by the
// tests below.
func TestGPUChildHelper(t *testing.T) {
	role := os.Getenv(childRoleEnv)
	if role == "" {
		t.Skip("helper process of the cross-process tests")
	}
	seed, err := strconv.ParseUint(os.Getenv(childSeedEnv), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	d, err := OpenDevice(0, Config{CopyMode: CopyPerCopy})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Close(); err != nil {
			t.Errorf("child Close: %v", err)
		}
	}()
	switch role {
	case "ipc":
		base, err := d.AllocDevice(ipcAllocSize)
		if err != nil {
			t.Fatal(err)
		}
		defer d.FreeDevice(base)
		if err := d.CopyHtoD(base, devicetest.RandBytes(seed, ipcAllocSize)); err != nil {
			t.Fatal(err)
		}
		x, err := d.Export(base + ipcViewOff)
		if err != nil {
			t.Fatal(err)
		}
		if x.Base != base || x.Offset != ipcViewOff || x.Handle.Size < ipcAllocSize {
			t.Fatalf("Export(base+%d) = base %#x off %d size %d; allocated %#x", ipcViewOff, x.Base, x.Offset, x.Handle.Size, base)
		}
		childSend(t, fmt.Sprintf("%x %d %d", x.Handle.Bytes, x.Offset, x.Handle.Size), -1)
		childServe(t, d, base)
	case "vmm":
		v, err := d.VMMAlloc(ipcAllocSize + 1)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := v.Free(); err != nil {
				t.Error(err)
			}
		}()
		if err := d.CopyHtoD(v.Addr(), devicetest.RandBytes(seed, ipcAllocSize)); err != nil {
			t.Fatal(err)
		}
		fd, err := v.ExportFD()
		if err != nil {
			t.Fatal(err)
		}
		childSend(t, fmt.Sprintf("%d %s %q", v.Size(), v.HandleTypesString(), fmt.Sprint(v.FabricErr())), fd)
		syscall.Close(fd)
		childServe(t, d, v.Addr())
	default:
		t.Fatalf("unknown role %q", role)
	}
}

func childSend(t *testing.T, msg string, fd int) {
	var oob []byte
	if fd >= 0 {
		oob = syscall.UnixRights(fd)
	}
	if err := syscall.Sendmsg(childFD, []byte(msg), oob, nil, 0); err != nil {
		t.Fatalf("child sendmsg: %v", err)
	}
}

// childServe answers "check OFF LEN SEED" (verify bytes the parent wrote)
// until "done" or EOF.
func childServe(t *testing.T, d *Device, base device.Addr) {
	buf := make([]byte, 4096)
	for {
		n, err := syscall.Read(childFD, buf)
		if err != nil {
			t.Fatalf("child read: %v", err)
		}
		msg := string(buf[:n])
		if n == 0 || msg == "done" {
			return
		}
		var off, n2, seed uint64
		if _, err := fmt.Sscanf(msg, "check %d %d %d", &off, &n2, &seed); err != nil {
			t.Fatalf("child: bad request %q", msg)
		}
		got := make([]byte, n2)
		if err := d.CopyDtoH(got, base+device.Addr(off)); err != nil {
			t.Fatal(err)
		}
		reply := "ok"
		if i := devicetest.Mismatch(got, devicetest.RandBytes(seed, int(n2))); i >= 0 {
			reply = fmt.Sprintf("byte %d of the parent's write differs", i)
		}
		childSend(t, reply, -1)
	}
}

type child struct {
	t    *testing.T
	sock int
	cmd  *exec.Cmd
	out  *bytes.Buffer
}

func startChild(t *testing.T, role string, seed uint64) *child {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	tv := syscall.Timeval{Sec: 120}
	if err := syscall.SetsockoptTimeval(fds[0], syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	end := os.NewFile(uintptr(fds[1]), "child-socket")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, sock: fds[0], out: &bytes.Buffer{}}
	c.cmd = exec.Command(exe, "-test.run=^TestGPUChildHelper$", "-test.v", "-test.count=1")
	c.cmd.Env = append(os.Environ(), childRoleEnv+"="+role, fmt.Sprintf("%s=%d", childSeedEnv, seed))
	c.cmd.ExtraFiles = []*os.File{end}
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	end.Close()
	t.Cleanup(func() {
		syscall.Close(c.sock)
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	})
	return c
}

// recv returns the child's next message and the fd that came with it (-1).
func (c *child) recv() (string, int) {
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(4))
	n, oobn, _, _, err := syscall.Recvmsg(c.sock, buf, oob, 0)
	if err != nil || n == 0 {
		c.cmd.Wait()
		c.t.Fatalf("child sent nothing (%v); its output:\n%s", err, c.out)
	}
	fd := -1
	if oobn > 0 {
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			c.t.Fatalf("control message: %v", err)
		}
		fds, err := syscall.ParseUnixRights(&msgs[0])
		if err != nil || len(fds) != 1 {
			c.t.Fatalf("unix rights: %v %v", fds, err)
		}
		fd = fds[0]
	}
	return string(buf[:n]), fd
}

func (c *child) send(msg string) {
	if _, err := syscall.Write(c.sock, []byte(msg)); err != nil {
		c.t.Fatalf("send to child: %v", err)
	}
}

func (c *child) finish() {
	c.send("done")
	if err := c.cmd.Wait(); err != nil {
		c.t.Errorf("child: %v; its output:\n%s", err, c.out)
		return
	}
	c.t.Logf("child output:\n%s", strings.TrimSpace(c.out.String()))
}

// checkImported reads the view [base+off, +ipcViewLen) of an imported
// allocation with one copy and with a scattered kernel gather, then writes
// into it with a scatter and has the child verify the bytes.
func checkImported(t *testing.T, d *Device, c *child, base device.Addr, seed uint64) {
	want := devicetest.RandBytes(seed, ipcAllocSize)[ipcViewOff : ipcViewOff+ipcViewLen]
	view := base + ipcViewOff
	read := func(segs []device.Seg, wantBytes []byte) {
		t.Helper()
		p, err := d.AllocPinned(len(wantBytes))
		if err != nil {
			t.Fatal(err)
		}
		defer d.FreePinned(p)
		devicetest.Poison(p.Host(), 0xC3)
		s, err := d.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Gather(p, segs); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if err := devicetest.FirstDiff(p.Host(), wantBytes, segs); err != nil {
			t.Fatalf("reading the imported view: %v", err)
		}
	}
	read([]device.Seg{{Addr: view, Len: ipcViewLen}}, want)

	// The view in 16 KiB pieces (the last one short), shuffled.
	var segs []device.Seg
	for o := uint64(0); o < ipcViewLen; o += 16 << 10 {
		segs = append(segs, device.Seg{Addr: view + device.Addr(o), Len: min(16<<10, ipcViewLen-o)})
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	rng.Shuffle(len(segs), func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
	var w2 []byte
	for _, sg := range segs {
		o := uint64(sg.Addr - view)
		w2 = append(w2, want[o:o+sg.Len]...)
	}
	read(segs, w2)

	// Write through the mapping; the exporter checks.
	wseed := seed + 1
	src := devicetest.RandBytes(wseed, writeLen)
	p, err := d.AllocPinned(writeLen)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreePinned(p)
	copy(p.Host(), src)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wsegs []device.Seg
	for o := uint64(0); o < writeLen; o += 4099 {
		wsegs = append(wsegs, device.Seg{Addr: base + writeOff + device.Addr(o), Len: min(4099, writeLen-o)})
	}
	if err := s.Scatter(wsegs, p); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	c.send(fmt.Sprintf("check %d %d %d", writeOff, writeLen, wseed))
	if reply, _ := c.recv(); reply != "ok" {
		t.Fatalf("exporter after our scatter: %s", reply)
	}
}

func TestGPUIPCCrossProcess(t *testing.T) {
	d := openGPU(t, CopyKernel)
	seed := uint64(time.Now().UnixNano())
	c := startChild(t, "ipc", seed)
	msg, _ := c.recv()
	var hx string
	var off, size uint64
	if _, err := fmt.Sscanf(msg, "%s %d %d", &hx, &off, &size); err != nil {
		t.Fatalf("child message %q: %v", msg, err)
	}
	h, err := hex.DecodeString(hx)
	if err != nil || len(h) != 64 {
		t.Fatalf("handle %q: %v", hx, err)
	}
	if off != ipcViewOff {
		t.Fatalf("child exported offset %d, want %d", off, ipcViewOff)
	}
	// An engine that claims a larger allocation than the handle names is
	// refused: regions beyond the allocation would let peers reach past it.
	if m, err := d.Import(device.Handle{Kind: device.HandleCUDAIPC, Bytes: h, Size: size + 1<<20, FD: -1}); err == nil {
		m.Close()
		t.Fatal("imported a legacy IPC handle claiming 1 MiB more than its allocation")
	} else if !errors.Is(err, device.ErrBadHandle) {
		t.Fatalf("over-claimed IPC import: got %v, want ErrBadHandle", err)
	}
	m, err := d.Import(device.Handle{Kind: device.HandleCUDAIPC, Bytes: h, Size: size, FD: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("imported legacy IPC allocation: base %#x, %d B; view at +%d", m.Base(), m.Size(), off)
	checkImported(t, d, c, m.Base(), seed)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	c.finish()
}

func TestGPUVMMCrossProcess(t *testing.T) {
	d := openGPU(t, CopyKernel)
	seed := uint64(time.Now().UnixNano())
	c := startChild(t, "vmm", seed)
	msg, fd := c.recv()
	if fd < 0 {
		t.Fatalf("child message %q came without an fd", msg)
	}
	var size uint64
	var types, fabricErr string
	if _, err := fmt.Sscanf(msg, "%d %s %q", &size, &types, &fabricErr); err != nil {
		t.Fatalf("child message %q: %v", msg, err)
	}
	t.Logf("exporter's VMM allocation: %d B, handle types %s, fabric refused: %s", size, types, fabricErr)
	if m, err := d.Import(device.Handle{Kind: device.HandlePosixFD, FD: fd, Size: 2 * size}); err == nil {
		m.Close()
		syscall.Close(fd)
		t.Fatal("imported a POSIX-fd allocation claiming twice its size")
	} else {
		t.Logf("over-claimed POSIX-fd import refused: %v", err)
	}
	m, err := d.Import(device.Handle{Kind: device.HandlePosixFD, FD: fd, Size: size})
	// The fd stays ours; the mapping must not need it.
	syscall.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("imported POSIX-fd allocation: base %#x, %d B", m.Base(), m.Size())
	checkImported(t, d, c, m.Base(), seed)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	c.finish()
}
