package hostmem

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/device"
)

func TestOpen(t *testing.T) {
	t.Run("registered", func(t *testing.T) {
		dv, err := device.Open(device.KindHostmem, 3, device.Options{})
		if err != nil {
			t.Fatalf("device.Open: %v", err)
		}
		defer dv.Close()
		if _, ok := dv.(*Dev); !ok {
			t.Fatalf("device.Open: got %T, want *hostmem.Dev", dv)
		}
		if got, want := dv.String(), "hostmem:3"; got != want {
			t.Errorf("String: got %q, want %q", got, want)
		}
		if got, want := dv.Kind(), device.KindHostmem; got != want {
			t.Errorf("Kind: got %q, want %q", got, want)
		}
		if got, want := dv.Ordinal(), 3; got != want {
			t.Errorf("Ordinal: got %d, want %d", got, want)
		}
	})
	bad := []struct {
		name    string
		ordinal int
		opts    Config
		want    string
	}{
		{"negative ordinal", -1, Config{}, "ordinal -1"},
		{"negative bandwidth", 0, Config{BandwidthBytesPerSec: -1}, "bandwidth"},
		{"NaN bandwidth", 0, Config{BandwidthBytesPerSec: math.NaN()}, "bandwidth"},
		{"infinite bandwidth", 0, Config{BandwidthBytesPerSec: math.Inf(1)}, "bandwidth"},
		{"negative latency", 0, Config{Latency: -5}, "latency"},
		{"negative fail after", 0, Config{Fail: true, FailAfter: -1}, "fail after -1 copies"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Open(tc.ordinal, device.Options{Backend: tc.opts})
			if err == nil {
				d.Close()
				t.Fatalf("got nil error, want one containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestImportSharedSeesSameBytes(t *testing.T) {
	tests := []struct {
		name string
		size int
	}{
		{"one page", 4096},
		{"not page-rounded", 10000},
		{"4 MiB", 4 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDev(t, Config{})
			sh, m := newSharedT(t, d, tc.size)
			if got, want := m.Size(), uint64(tc.size); got != want {
				t.Fatalf("Size: got %d, want %d", got, want)
			}
			if uintptr(m.Base()) == addrOf(sh.Bytes()) {
				t.Fatalf("Base: got the engine's own mapping %#x, want a second mapping", uint64(m.Base()))
			}
			view := bytesAt(m.Base(), m.Size())
			rng := newRand(t)
			// Engine writes, sidecar reads.
			fillRandom(rng, sh.Bytes())
			if !bytes.Equal(view, sh.Bytes()) {
				t.Fatalf("imported mapping does not see what the engine wrote (first difference at %d)", firstDiff(view, sh.Bytes()))
			}
			// Sidecar writes, engine reads.
			fillRandom(rng, view)
			if !bytes.Equal(sh.Bytes(), view) {
				t.Fatalf("engine does not see what was written through the imported mapping (first difference at %d)", firstDiff(sh.Bytes(), view))
			}
			// The import outlives the engine's mapping and fd.
			want := bytes.Clone(view)
			if err := sh.Close(); err != nil {
				t.Fatalf("Shared Close: %v", err)
			}
			if !bytes.Equal(view, want) {
				t.Errorf("imported mapping changed after the engine closed its side")
			}
		})
	}
}

func TestImportErrors(t *testing.T) {
	d := newDev(t, Config{})
	sh, err := NewShared("small", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])
	closedFD, err := unix.Dup(sh.FD())
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(closedFD)
	memfd := func(fd int, size uint64) device.Handle {
		return device.Handle{Kind: device.HandleMemfd, FD: fd, Size: size}
	}
	tests := []struct {
		name   string
		h      device.Handle
		target error
		want   string
	}{
		{"fd too small", memfd(sh.FD(), 8192), device.ErrBadHandle, "is 4096 B, smaller than the 8192 B"},
		{"size 0", memfd(sh.FD(), 0), device.ErrBadHandle, "size is 0"},
		{"fd -1", memfd(-1, 4096), device.ErrBadHandle, "fd -1"},
		{"closed fd", memfd(closedFD, 4096), unix.EBADF, "fstat"},
		{"pipe", memfd(pipe[0], 4096), device.ErrBadHandle, "not a memfd"},
		{"cuda ipc", device.Handle{Kind: device.HandleCUDAIPC, Bytes: make([]byte, 64), FD: -1, Size: 4096}, device.ErrNotSupported, "cuda-ipc"},
		{"posix fd", device.Handle{Kind: device.HandlePosixFD, FD: sh.FD(), Size: 4096}, device.ErrNotSupported, "posix-fd"},
		{"unknown kind", device.Handle{Kind: 42, FD: -1, Size: 4096}, device.ErrNotSupported, "handle(42)"},
		{"host addr 0", device.Handle{Kind: device.HandleHostAddr, Size: 4096}, device.ErrBadHandle, "address 0"},
		{"host addr size 0", device.Handle{Kind: device.HandleHostAddr, Addr: 4096}, device.ErrBadHandle, "size is 0"},
		{"host addr wraps", device.Handle{Kind: device.HandleHostAddr, Addr: math.MaxUint64 - 10, Size: 4096}, device.ErrBadHandle, "wraps"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := d.Import(tc.h)
			if err == nil {
				m.Close()
				t.Fatalf("got nil error, want %v", tc.target)
			}
			if !errors.Is(err, tc.target) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error wrapping %v containing %q", err, tc.target, tc.want)
			}
		})
	}
	if got := d.Stats().Mappings; got != 0 {
		t.Errorf("mappings after failed imports: got %d, want 0", got)
	}
}

func TestPinned(t *testing.T) {
	d := newDev(t, Config{})
	p, err := d.AllocPinned(10000)
	if err != nil {
		t.Fatalf("AllocPinned: %v", err)
	}
	if got, want := p.Len(), 10000; got != want {
		t.Errorf("Len: got %d, want %d", got, want)
	}
	if got, want := uintptr(p.DeviceAddr()), addrOf(p.Host()); got != want {
		t.Errorf("DeviceAddr: got %#x, want the host address %#x", got, want)
	}
	if s := p.Slice(100, 50); uintptr(s.DeviceAddr()) != addrOf(s.Host()) {
		t.Errorf("Slice: device view %#x, host view %#x; want equal", uint64(s.DeviceAddr()), addrOf(s.Host()))
	}
	p.Host()[9999] = 1 // writable to the end
	st := d.Stats()
	if st.PinnedBuffers != 1 || st.PinnedBytes != 10000 {
		t.Errorf("Stats: got %d buffers, %d B; want 1, 10000", st.PinnedBuffers, st.PinnedBytes)
	}

	bad := []struct {
		name string
		p    device.Pinned
	}{
		{"slice", p.Slice(0, 100)},
		{"offset slice", p.Slice(100, 9900)},
		{"other memory", device.NewPinned(make([]byte, 10), 0)},
		{"zero", device.Pinned{}},
	}
	for _, tc := range bad {
		t.Run("free "+tc.name, func(t *testing.T) {
			if err := d.FreePinned(tc.p); !errors.Is(err, device.ErrBadHandle) {
				t.Errorf("got %v, want ErrBadHandle", err)
			}
		})
	}
	if err := d.FreePinned(p); err != nil {
		t.Fatalf("FreePinned: got %v, want nil", err)
	}
	if err := d.FreePinned(p); !errors.Is(err, device.ErrBadHandle) || !strings.Contains(err.Error(), "freed twice?") {
		t.Errorf("second FreePinned: got %v, want ErrBadHandle saying freed twice", err)
	}
	for _, n := range []int{0, -1} {
		if _, err := d.AllocPinned(n); err == nil {
			t.Errorf("AllocPinned(%d): got nil error, want one", n)
		}
	}
	if st := d.Stats(); st.PinnedBuffers != 0 || st.PinnedBytes != 0 {
		t.Errorf("Stats after free: got %d buffers, %d B; want 0, 0", st.PinnedBuffers, st.PinnedBytes)
	}
}

func TestCloseReportsLeaks(t *testing.T) {
	dv, err := Open(0, device.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := dv.(*Dev)
	sh, err := NewShared("leak", 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	m, err := d.Import(sh.Handle())
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	s2, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	ev, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	p1, err := d.AllocPinned(4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.AllocPinned(8192); err != nil {
		t.Fatal(err)
	}
	// Work still queued when the device closes is run first.
	if err := s.Gather(p1, []device.Seg{sg(m.Base(), 4096)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Record(ev); err != nil {
		t.Fatal(err)
	}
	got := d.Stats()
	want := Stats{Streams: 2, Events: 1, PinnedBuffers: 2, PinnedBytes: 12288, Mappings: 1, Copies: got.Copies, Bytes: got.Bytes}
	if got != want {
		t.Errorf("Stats before Close: got %+v, want %+v", got, want)
	}

	err = d.Close()
	if !errors.Is(err, ErrLeaked) {
		t.Fatalf("Close: got %v, want ErrLeaked", err)
	}
	t.Logf("Close: %v", err)
	for _, w := range []string{"2 streams", "1 event", "2 pinned buffers (12288 B)", "1 mapping"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Close: got %q, want it to mention %q", err, w)
		}
	}
	if got, want := d.Stats(), (Stats{Copies: 1, Bytes: 4096}); got != want {
		t.Errorf("Stats after Close: got %+v, want %+v", got, want)
	}
	after := []struct {
		name string
		f    func() error
	}{
		{"device Close", d.Close},
		{"stream Close", s.Close},
		{"stream2 Close", s2.Close},
		{"event Close", ev.Close},
		{"mapping Close", m.Close},
		{"NewStream", func() error { _, err := d.NewStream(); return err }},
		{"NewEvent", func() error { _, err := d.NewEvent(); return err }},
		{"AllocPinned", func() error { _, err := d.AllocPinned(4096); return err }},
		{"Import", func() error { _, err := d.Import(sh.Handle()); return err }},
		{"FreePinned", func() error { return d.FreePinned(p1) }},
	}
	for _, a := range after {
		if err := a.f(); !errors.Is(err, device.ErrClosed) {
			t.Errorf("%s after device Close: got %v, want ErrClosed", a.name, err)
		}
	}
}

func TestCloseClean(t *testing.T) {
	dv, err := Open(0, device.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := dv.NewStream()
	e, _ := dv.NewEvent()
	p, _ := dv.AllocPinned(100)
	for _, f := range []func() error{s.Close, e.Close, func() error { return dv.FreePinned(p) }} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	if err := dv.Close(); err != nil {
		t.Errorf("Close with nothing open: got %v, want nil", err)
	}
}

func TestShared(t *testing.T) {
	sh, err := NewShared("kv", 12345)
	if err != nil {
		t.Fatalf("NewShared: %v", err)
	}
	if got, want := sh.Size(), 12345; got != want {
		t.Errorf("Size: got %d, want %d", got, want)
	}
	if got, want := len(sh.Bytes()), 12345; got != want {
		t.Errorf("len(Bytes): got %d, want %d", got, want)
	}
	if !bytes.Equal(sh.Bytes(), make([]byte, 12345)) {
		t.Errorf("Bytes: got non-zero bytes in fresh memory")
	}
	h := sh.Handle()
	if want := (device.Handle{Kind: device.HandleMemfd, FD: sh.FD(), Size: 12345}); h.Kind != want.Kind || h.FD != want.FD || h.Size != want.Size {
		t.Errorf("Handle: got %+v, want %+v", h, want)
	}
	var st unix.Stat_t
	if err := unix.Fstat(sh.FD(), &st); err != nil || st.Size != 12345 {
		t.Errorf("fstat of FD: got size %d, err %v; want 12345, nil", st.Size, err)
	}
	if link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(sh.FD())); err == nil && !strings.Contains(link, "memfd:kv") {
		t.Errorf("fd links to %q, want a memfd named kv", link)
	}
	flags, err := unix.FcntlInt(uintptr(sh.FD()), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("F_GETFD: got %#x, %v; want FD_CLOEXEC set", flags, err)
	}
	fd := sh.FD()
	if err := sh.Close(); err != nil {
		t.Fatalf("Close: got %v, want nil", err)
	}
	if err := unix.Fstat(fd, &st); !errors.Is(err, unix.EBADF) {
		t.Errorf("fstat after Close: got %v, want EBADF (fd closed)", err)
	}
	if err := sh.Close(); !errors.Is(err, device.ErrClosed) {
		t.Errorf("second Close: got %v, want ErrClosed", err)
	}
	if sh.Bytes() != nil || sh.FD() != -1 {
		t.Errorf("after Close: got Bytes len %d, FD %d; want nil, -1", len(sh.Bytes()), sh.FD())
	}

	for _, n := range []int{0, -4096} {
		if _, err := NewShared("kv", n); err == nil {
			t.Errorf("NewShared(%d): got nil error, want one", n)
		}
	}
}

func TestSyscallErrors(t *testing.T) {
	// 1 PiB does not fit in the 47-bit address space of a process: ftruncate
	// works on tmpfs, mmap says ENOMEM.
	_, err := NewShared("kv", 1<<50)
	if err == nil {
		t.Fatal("NewShared(1 PiB): got nil error, want ENOMEM")
	}
	if !errors.Is(err, unix.ENOMEM) && !errors.Is(err, unix.EFBIG) && !errors.Is(err, unix.EINVAL) {
		t.Errorf("NewShared(1 PiB): got %v, want an errno", err)
	}
	if !strings.HasPrefix(err.Error(), "hostmem: ") || !strings.Contains(err.Error(), `"kv"`) || !strings.Contains(err.Error(), "1125899906842624") {
		t.Errorf("NewShared(1 PiB): got %q, want it to start with hostmem: and name the call, the memfd and the size", err)
	}
	t.Logf("NewShared(1 PiB): %v", err)

	tests := []struct {
		call  string
		errno unix.Errno
		want  string
		oom   bool
	}{
		{`memfd_create("kv", MFD_CLOEXEC)`, unix.ENOMEM, `memfd_create("kv", MFD_CLOEXEC): ENOMEM`, true},
		{"close(fd 7)", unix.EBADF, "close(fd 7): EBADF", false},
	}
	for _, tc := range tests {
		err := fmt.Errorf("hostmem: %w", sysErr(tc.call, tc.errno))
		if got := err.Error(); got != "hostmem: "+tc.want {
			t.Errorf("got %q, want %q", got, "hostmem: "+tc.want)
		}
		if !errors.Is(err, tc.errno) {
			t.Errorf("%q: errors.Is(%v): got false, want true", err, tc.errno)
		}
		if got := errors.Is(err, device.ErrOutOfMemory); got != tc.oom {
			t.Errorf("%q: errors.Is(ErrOutOfMemory): got %v, want %v", err, got, tc.oom)
		}
	}
}

func TestBytesAt(t *testing.T) {
	b := []byte("hello, device")
	got := bytesAt(device.Addr(uintptr(unsafe.Pointer(&b[0]))+7), 6)
	if string(got) != "device" {
		t.Errorf("got %q, want %q", got, "device")
	}
}
