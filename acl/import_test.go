package acl

import (
	"bytes"
	"errors"
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

// Cross-process tests: the test binary re-executes itself as a child (the
// "sidecar") that imports memory the parent (the "engine") exported by
// key, and moves bytes through it. They talk over a SOCK_SEQPACKET
// socketpair, the child's end at fd 3.

const (
	childRoleEnv = "STAGE_ACL_TEST_CHILD"
	childSeedEnv = "STAGE_ACL_TEST_SEED"
	childFD      = 3

	ipcAllocSize = 8 << 20
	ipcViewOff   = 1_000_003 // odd: the view is a sub-range of the allocation
	ipcViewLen   = 3<<20 + 5
	ipcWriteOff  = 2_000_001 // inside the view
	ipcWriteLen  = 1<<20 + 3
)

func TestFakeIPCSameProcess(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, Config{})
	base, data := devicetest.Pool(t, d, 1<<20, 21)
	x, err := d.Export(base + 12345)
	if err != nil {
		t.Fatal(err)
	}
	key, off, size := string(x.Handle.Bytes), x.Offset, x.Handle.Size
	if x.Base != base || off != 12345 || size != 1<<20 || checkKey(key) != nil || x.Handle.Kind != device.HandleACLKey {
		t.Fatalf("Export(base+12345) = base %#x %s %q off %d size %d; allocated %#x", x.Base, x.Handle.Kind, key, off, size, base)
	}
	if x2, err := d.Export(base + 7); err != nil || string(x2.Handle.Bytes) != key {
		t.Errorf("second Export of the allocation: key %q, %v; want the same key", x2.Handle.Bytes, err)
	}
	m, err := d.Import(x.Handle)
	if err != nil {
		t.Fatal(err)
	}
	if m.Size() != size || m.Base() == base {
		t.Errorf("mapping base %#x size %d: want a second mapping of %d B", m.Base(), m.Size(), size)
	}
	// Two mappings, one memory.
	got := make([]byte, 4096)
	if err := d.CopyDtoH(got, m.Base()+device.Addr(off)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data[off:off+4096]) {
		t.Error("the imported mapping does not show the exported bytes at the offset")
	}
	// The engine claiming more than the allocation holds is refused (and
	// the import undone: the fake's leak check would see it).
	if _, err := d.Import(device.Handle{Kind: device.HandleACLKey, Bytes: []byte(key), Size: size + 1, FD: -1}); !errors.Is(err, device.ErrBadHandle) && !strings.Contains(err.Error(), "already imported") {
		t.Errorf("oversized claim: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); !errors.Is(err, device.ErrClosed) {
		t.Errorf("second Close: %v, want ErrClosed", err)
	}
	// Now the oversized claim reaches the size check.
	if _, err := d.Import(device.Handle{Kind: device.HandleACLKey, Bytes: []byte(key), Size: size + 1, FD: -1}); !errors.Is(err, device.ErrBadHandle) {
		t.Errorf("oversized claim: %v, want ErrBadHandle", err)
	}

	// A key whose whitelist does not hold this process is refused.
	other, _ := devicetest.Pool(t, d, 8192, 22)
	x2, err := d.Export(other, 1)
	if err != nil {
		t.Fatal(err)
	}
	var ae *Error
	if _, err := d.Import(x2.Handle); !errors.As(err, &ae) || ae.Code != 207006 {
		t.Errorf("import without being whitelisted: %v, want ACL_ERROR_RT_NO_PERMISSION", err)
	}
}

func TestFakeIPCAbsent(t *testing.T) {
	l := fakeLibrary(t, "-DFAKEACL_NO_IPC")
	if l.HasIPC() {
		t.Fatal("HasIPC without the aclrtIpcMem* exports")
	}
	d := openDev(t, l, Config{})
	a, _ := devicetest.Pool(t, d, 4096, 1)
	if _, err := d.Export(a); !errors.Is(err, device.ErrNotSupported) {
		t.Errorf("Export: %v, want ErrNotSupported", err)
	}
	if _, err := d.Import(device.Handle{Kind: device.HandleACLKey, Bytes: []byte("k"), Size: 4096}); !errors.Is(err, device.ErrNotSupported) {
		t.Errorf("Import: %v, want ErrNotSupported", err)
	}
}

// TestFakeIPCChild: the parent exports the allocation base with the child's
// pid whitelisted; the child imports it, gathers the view at a non-zero,
// odd offset (three segments, out of order), checks every byte, scatters
// new bytes into part of the view, closes its import, and reports. The
// parent then checks that exactly those bytes changed, and frees (closing
// its key after the importer did). A second key whitelisted for the parent
// only is refused to the child.
func TestFakeIPCChild(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			so := buildFake(t)
			l := openFakeSO(t, so, true)
			d := openDev(t, l, Config{})
			seed := uint64(time.Now().UnixNano())
			base, data := devicetest.Pool(t, d, ipcAllocSize, seed)
			other, _ := devicetest.Pool(t, d, 65536, seed+1)

			pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			parentEnd := os.NewFile(uintptr(pair[0]), "parent")
			childEnd := os.NewFile(uintptr(pair[1]), "child")
			defer parentEnd.Close()
			var out bytes.Buffer
			cmd := exec.Command(os.Args[0], "-test.run=^TestFakeIPCChildHelper$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), childRoleEnv+"=import", childSeedEnv+"="+strconv.FormatUint(seed, 10),
				testLibraryEnv+"="+so, testCopyModeEnv+"="+string(mode))
			cmd.ExtraFiles = []*os.File{childEnd}
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			childEnd.Close()
			exited := false
			defer func() {
				if !exited {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
				}
			}()

			x, err := d.Export(base+ipcViewOff, int32(cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			key, off, size := string(x.Handle.Bytes), x.Offset, x.Handle.Size
			if x.Base != base || off != ipcViewOff || size != ipcAllocSize {
				t.Fatalf("Export(base+%d) = base %#x off %d size %d; allocated %#x", ipcViewOff, x.Base, off, size, base)
			}
			x2, err := d.Export(other, int32(os.Getpid()))
			if err != nil {
				t.Fatal(err)
			}
			key2 := string(x2.Handle.Bytes)
			if _, err := parentEnd.Write([]byte(fmt.Sprintf("%s %s %d %d", key, key2, off, size))); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4096)
			parentEnd.SetReadDeadline(time.Now().Add(60 * time.Second))
			n, err := parentEnd.Read(buf)
			werr := cmd.Wait()
			exited = true
			if err != nil || string(buf[:n]) != "ok" || werr != nil {
				t.Fatalf("child: reply %q (%v), exit %v\n%s", buf[:n], err, werr, out.String())
			}
			got := make([]byte, ipcAllocSize)
			if err := d.CopyDtoH(got, base); err != nil {
				t.Fatal(err)
			}
			want := append([]byte(nil), data...)
			copy(want[ipcViewOff+ipcWriteOff:], devicetest.RandBytes(seed^0xc0ffee, ipcWriteLen))
			if i := devicetest.Mismatch(got, want); i >= 0 {
				t.Fatalf("allocation byte %d (view offset %d) is %#02x, want %#02x: the child's write landed in the wrong place",
					i, i-ipcViewOff, got[i], want[i])
			}
			// devicePool's cleanup frees: the exporter closes its key only
			// now that the importer closed its own (the fake refuses the
			// other order).
		})
	}
}

// TestFakeIPCChildHelper is the child of TestFakeIPCChild; it skips unless
// started by it.
func TestFakeIPCChildHelper(t *testing.T) {
	if os.Getenv(childRoleEnv) == "" {
		t.Skip("helper process of TestFakeIPCChild")
	}
	reply := func(msg string) {
		if _, err := syscall.Write(childFD, []byte(msg)); err != nil {
			t.Fatalf("child write: %v", err)
		}
	}
	seed, err := strconv.ParseUint(os.Getenv(childSeedEnv), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	d, err := OpenDevice(0, Config{Library: os.Getenv(testLibraryEnv), CopyMode: CopyMode(os.Getenv(testCopyModeEnv)), Logf: t.Logf})
	if err != nil {
		reply(err.Error())
		t.Fatal(err)
	}
	defer func() {
		if err := d.Close(); err != nil {
			t.Errorf("child Close: %v", err)
		}
	}()
	buf := make([]byte, 4096)
	n, err := syscall.Read(childFD, buf)
	if err != nil {
		t.Fatal(err)
	}
	var key, key2 string
	var off, size uint64
	if _, err := fmt.Sscanf(string(buf[:n]), "%s %s %d %d", &key, &key2, &off, &size); err != nil {
		t.Fatalf("child: bad request %q: %v", buf[:n], err)
	}
	if err := childWork(d, key, key2, off, size, seed); err != nil {
		reply(err.Error())
		t.Fatal(err)
	}
	reply("ok")
}

func childWork(d *Device, key, key2 string, off, size, seed uint64) error {
	m, err := d.Import(device.Handle{Kind: device.HandleACLKey, Bytes: []byte(key), Size: size, FD: -1})
	if err != nil {
		return err
	}
	defer m.Close() // importer closes first: the parent frees after our reply
	view := m.Base() + device.Addr(off)
	data := devicetest.RandBytes(seed, ipcAllocSize)[off : off+ipcViewLen]
	s, err := d.NewStream()
	if err != nil {
		return err
	}
	defer s.Close()
	p, err := d.AllocPinned(ipcViewLen)
	if err != nil {
		return err
	}
	defer d.FreePinned(p)
	// The view as three segments, last first.
	segs := []device.Seg{
		{Addr: view + 2<<20, Len: ipcViewLen - 2<<20},
		{Addr: view + 1<<20, Len: 1 << 20},
		{Addr: view, Len: 1 << 20},
	}
	if err := s.Gather(p, segs); err != nil {
		return err
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	want := append(append(append([]byte(nil), data[2<<20:]...), data[1<<20:2<<20]...), data[:1<<20]...)
	if i := devicetest.Mismatch(p.Host(), want); i >= 0 {
		return fmt.Errorf("child: gathered byte %d of the view is %#02x, want %#02x (import offset lost?)", i, p.Host()[i], want[i])
	}
	w := p.Slice(0, ipcWriteLen)
	copy(w.Host(), devicetest.RandBytes(seed^0xc0ffee, ipcWriteLen))
	if err := s.Scatter([]device.Seg{{Addr: view + ipcWriteOff, Len: ipcWriteLen}}, w); err != nil {
		return err
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	var ae *Error
	if m2, err := d.Import(device.Handle{Kind: device.HandleACLKey, Bytes: []byte(key2), Size: 65536, FD: -1}); err == nil {
		m2.Close()
		return errors.New("child: imported a key whose whitelist does not name it")
	} else if !errors.As(err, &ae) || ae.Code != 207006 {
		return fmt.Errorf("child: import of a key not whitelisted for it: %v, want 207006", err)
	}
	return nil
}
