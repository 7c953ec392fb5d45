package hostmem

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/device"
)

// memfdT is a memfd of size bytes made with flags and then sealed with
// seals (0: none added), closed at cleanup.
func memfdT(t *testing.T, flags, seals, size int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("fault-test", flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

// TestImportRefusesShrinkable: a memfd whose owner can still truncate it is
// refused with an error that says how to seal it (issue 35, item 1); one
// sealed against shrinking is mapped.
func TestImportRefusesShrinkable(t *testing.T) {
	d := newDev(t, Config{})
	const size = 1 << 20
	file, err := os.Create(t.TempDir() + "/plain")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if err := file.Truncate(size); err != nil {
		t.Fatal(err)
	}
	memfd := func(fd int) device.Handle { return device.Handle{Kind: device.HandleMemfd, FD: fd, Size: size} }
	const how = "F_ADD_SEALS, F_SEAL_SHRINK|F_SEAL_GROW"
	for _, tc := range []struct {
		name string
		fd   int
		want string // "" : imported
	}{
		{"not sealable", memfdT(t, unix.MFD_CLOEXEC, 0, size), "lack F_SEAL_SHRINK"},
		{"sealable, no seals", memfdT(t, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING, 0, size), "lack F_SEAL_SHRINK"},
		{"grow sealed only", memfdT(t, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING, unix.F_SEAL_GROW, size), "lack F_SEAL_SHRINK"},
		{"file", int(file.Fd()), "F_SEAL_SHRINK"},
		{"shrink sealed", memfdT(t, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING, unix.F_SEAL_SHRINK, size), ""},
		{"fully sealed", memfdT(t, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW, size), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := d.Import(memfd(tc.fd))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Import: %v", err)
				}
				if err := m.Close(); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				m.Close()
				t.Fatal("Import of a memfd that can shrink: got nil error")
			}
			if !errors.Is(err, device.ErrBadHandle) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), how) {
				t.Errorf("got %v, want an error wrapping %v containing %q and saying how to seal (%q)", err, device.ErrBadHandle, tc.want, how)
			}
		})
	}
	if got := d.Stats().Mappings; got != 0 {
		t.Errorf("mappings left: got %d, want 0", got)
	}
}

// TestNewSharedIsSealed: the engine-side memory this package makes is what
// Import accepts: it cannot shrink nor grow.
func TestNewSharedIsSealed(t *testing.T) {
	sh, err := NewShared("sealed", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	seals, err := unix.FcntlInt(uintptr(sh.FD()), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW; seals&want != want {
		t.Errorf("seals %#x, want F_SEAL_SHRINK|F_SEAL_GROW (%#x)", seals, want)
	}
	if err := unix.Ftruncate(sh.FD(), 0); !errors.Is(err, unix.EPERM) {
		t.Errorf("ftruncate of a NewShared memfd: got %v, want EPERM", err)
	}
}

// truncatedT maps a 1 MiB memfd that can shrink (as an engine would have
// before sealing was required, or memory forced past the check) and
// truncates it to 0: every access to the mapping now faults (SIGBUS).
// It returns the mapping's address as a host-addr import into d.
func truncatedT(t *testing.T, d *Dev) device.Mapping {
	t.Helper()
	const size = 1 << 20
	fd := memfdT(t, unix.MFD_CLOEXEC, 0, size)
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	m, err := d.Import(device.Handle{Kind: device.HandleHostAddr, Addr: device.Addr(addrOf(b)), Size: size})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.Ftruncate(fd, 0); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestCopyFaultFailsCopy: a copy from or to memory truncated under it
// fails with ErrFault, on a stream, synchronously and device to device,
// and the process goes on (issue 35, item 1: it died with SIGBUS).
func TestCopyFaultFailsCopy(t *testing.T) {
	d := newDev(t, Config{})
	m := truncatedT(t, d)
	p := allocPinnedT(t, d, 128<<10)
	segs := []device.Seg{{Addr: m.Base() + 4096, Len: 64 << 10}, {Addr: m.Base() + 512<<10, Len: 64 << 10}}
	wantFault := func(t *testing.T, what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrFault) || !strings.Contains(err.Error(), "truncated") {
			t.Errorf("%s: got %v, want an error wrapping ErrFault that asks whether the memory was truncated", what, err)
		}
	}
	for _, kind := range []opKind{opGather, opScatter} {
		t.Run(kind.String(), func(t *testing.T) {
			s := newStreamT(t, d)
			var err error
			if kind == opGather {
				err = s.Gather(p, segs)
			} else {
				err = s.Scatter(segs, p)
			}
			if err != nil {
				t.Fatalf("enqueue: %v", err)
			}
			wantFault(t, "Synchronize", s.Synchronize())
			if kind == opGather {
				err = d.GatherSync(p, segs)
			} else {
				err = d.ScatterSync(segs, p)
			}
			wantFault(t, "synchronous", err)
		})
	}
	t.Run("dtod", func(t *testing.T) {
		s := newStreamT(t, d)
		if err := s.(device.DtoD).CopyDtoD(p.DeviceAddr(), m.Base(), 4096); err != nil {
			t.Fatalf("enqueue: %v", err)
		}
		wantFault(t, "Synchronize", s.Synchronize())
	})
	if got := d.Stats().Failed; got != 5 {
		t.Errorf("failed copies: got %d, want 5", got)
	}
	// The device still works for memory that is there.
	s := newStreamT(t, d)
	ok := allocPinnedT(t, d, 4096)
	if err := s.Gather(p.Slice(0, 4096), []device.Seg{{Addr: ok.DeviceAddr(), Len: 4096}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatalf("copy after the faults: %v", err)
	}
}
