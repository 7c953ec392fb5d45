package acl

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/devicetest"
)

// Cross-process key tests: the child of child_test.go (the "sidecar")
// imports memory the parent (the "engine") exported by key, and moves
// bytes through it ("key").

const (
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

			c := startChild(t, so, 0, mode)
			if r := c.ask("mode"); r != string(mode) {
				t.Fatalf("the child copies in mode %q, want %q", r, mode)
			}
			x, err := d.Export(base+ipcViewOff, c.pid())
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
			if r := c.ask(fmt.Sprintf("key %s %s %d %d %d", key, key2, off, size, seed)); r != "ok" {
				t.Fatalf("child: %s\n%s", r, c.out.String())
			}
			c.finish()
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

// keyChildWork is the child's "key" request: import key (an allocation of
// size B) and, through its view at off, gather the view as three
// segments and check every byte against RandBytes(seed), scatter
// RandBytes(seed^0xc0ffee) at ipcWriteOff, and close the import; key2,
// whose whitelist does not name the child, must be refused.
func keyChildWork(d *Device, key, key2 string, off, size, seed uint64) error {
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
