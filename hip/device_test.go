package hip

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/vendorkit"
)

func TestPinnedBothAddresses(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, 0)
	p, err := d.AllocPinned(3<<20 + 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := hook(t, l, "fakehip_last_host_flags"); got != hostMallocPortable|hostMallocMapped {
		t.Errorf("hipHostMalloc flags %#x, want PORTABLE|MAPPED (0x3)", got)
	}
	host := uintptr(unsafe.Pointer(&p.Host()[0]))
	if p.Len() != 3<<20+1 || p.DeviceAddr() == 0 || uintptr(p.DeviceAddr()) == host {
		t.Errorf("pinned: %d B, host %#x, device %#x; want 3 MiB+1 with a device view of its own (the fake's differs from the host address)",
			p.Len(), host, uint64(p.DeviceAddr()))
	}
	if want := device.Addr(host) | 1<<62; p.DeviceAddr() != want {
		t.Errorf("device view %#x, want %#x (what hipHostGetDevicePointer returned for the host address)", uint64(p.DeviceAddr()), uint64(want))
	}
	if n := hook(t, l, "fakehip_pinned"); n != 1 {
		t.Errorf("fake holds %d pinned buffers, want 1", n)
	}
	for _, tc := range []struct {
		name string
		p    device.Pinned
		want string
	}{
		{"a slice", p.Slice(0, 4096), "pass the whole buffer, not a slice"},
		{"an offset slice", p.Slice(4096, 4096), "not a buffer of this device"},
		{"an empty buffer", device.Pinned{}, "empty buffer"},
	} {
		if err := d.FreePinned(tc.p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("FreePinned(%s): %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
	if err := d.FreePinned(p); err != nil {
		t.Fatal(err)
	}
	if err := d.FreePinned(p); err == nil {
		t.Error("second FreePinned succeeded")
	}
	if n := hook(t, l, "fakehip_pinned"); n != 0 {
		t.Errorf("fake holds %d pinned buffers after FreePinned, want 0", n)
	}
}

func TestPinnedErrors(t *testing.T) {
	tests := []struct {
		name string
		env  string
		n    int
		want string
		oom  bool
	}{
		{"zero size", "", 0, "AllocPinned(0): size must be positive", false},
		{"out of pinned memory", "FAKEHIP_HOST_LIMIT=4096", 8192,
			"hip: hipHostMalloc(8192 B, PORTABLE|MAPPED): hipErrorOutOfMemory: out of memory; lower staging.slots or staging.slot_size", true},
		{"no device view", "FAKEHIP_NO_DEVICE_POINTER=1", 4096,
			"hip: hipHostGetDevicePointer(pinned buffer of 4096 B, freed again): hipErrorInvalidValue: invalid argument", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if k, v, ok := strings.Cut(tc.env, "="); ok {
				t.Setenv(k, v)
			}
			l := fakeLibrary(t)
			d := openDev(t, l, 0)
			p, err := d.AllocPinned(tc.n)
			if err == nil {
				d.FreePinned(p)
				t.Fatal("AllocPinned succeeded")
			}
			if !strings.HasSuffix(err.Error(), tc.want) {
				t.Errorf("got %q, want it to end with %q", err, tc.want)
			}
			if errors.Is(err, device.ErrOutOfMemory) != tc.oom {
				t.Errorf("errors.Is(ErrOutOfMemory) = %v, want %v", !tc.oom, tc.oom)
			}
			if n := hook(t, l, "fakehip_pinned"); n != 0 {
				t.Errorf("fake holds %d pinned buffers after the failure, want 0", n)
			}
		})
	}
}

// segsOf cuts [base, base+size) into segments per the spec: pairs of
// (offset, length).
func segsOf(base device.Addr, spec ...uint64) []device.Seg {
	var segs []device.Seg
	for i := 0; i+1 < len(spec); i += 2 {
		segs = append(segs, device.Seg{Addr: base + device.Addr(spec[i]), Len: spec[i+1]})
	}
	return segs
}

// randomSegs picks n disjoint blocks of odd sizes in random order.
func randomSegs(seed uint64, base device.Addr, size uint64, n int) []device.Seg {
	r := rand.New(rand.NewPCG(seed, 7))
	cell := size / uint64(n)
	var segs []device.Seg
	for i := range n {
		l := 1 + r.Uint64N(cell)
		off := uint64(i)*cell + r.Uint64N(cell-l+1)
		segs = append(segs, device.Seg{Addr: base + device.Addr(off), Len: l})
	}
	r.Shuffle(len(segs), func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
	return segs
}

func TestGatherScatter(t *testing.T) {
	const size = 1 << 20
	l := fakeLibrary(t)
	d := openDev(t, l, 0)
	base, data := filled(t, d, size, 1)
	k := newKit(t, d, size)
	tests := []struct {
		name   string
		segs   []device.Seg
		copies int64 // hipMemcpyAsync calls expected
	}{
		{"one range", segsOf(base, 4097, 65536), 1},
		{"adjacent ranges merge into one copy", segsOf(base, 100, 10, 110, 20, 130, 4096), 1},
		{"reversed blocks", segsOf(base, 3*16384, 16384, 2*16384, 16384, 0, 16384), 3},
		{"empty segments are skipped", segsOf(base, 0, 0, 5, 3, 999, 0, 20, 1), 2},
		{"whole allocation", segsOf(base, 0, size), 1},
		{"64 random blocks", randomSegs(2, base, size, 64), -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := make([]byte, 0, size)
			for _, sg := range tc.segs {
				off := uint64(sg.Addr - base)
				want = append(want, data[off:off+sg.Len]...)
			}
			before := hook(t, l, "fakehip_copies")
			clear(k.p.Host())
			if msg := diff(k.gather(t, tc.segs), want); msg != "" {
				t.Fatalf("Gather of %d segments: %s", len(tc.segs), msg)
			}
			if n := hook(t, l, "fakehip_copies") - before; tc.copies >= 0 && n != tc.copies {
				t.Errorf("Gather issued %d copies, want %d", n, tc.copies)
			}
			if n := hook(t, l, "fakehip_sync_copies"); n != 0 {
				t.Errorf("%d copies ran synchronously: the pinned buffer was not used as pinned", n)
			}

			src := pattern(99, len(want))
			k.scatter(t, tc.segs, src)
			expect := append([]byte(nil), data...)
			o := uint64(0)
			for _, sg := range tc.segs {
				off := uint64(sg.Addr - base)
				copy(expect[off:off+sg.Len], src[o:o+sg.Len])
				o += sg.Len
			}
			if msg := diff(readDev(t, d, base, size), expect); msg != "" {
				t.Fatalf("after Scatter: %s", msg)
			}
			if err := d.CopyHtoD(base, data); err != nil { // restore for the next case
				t.Fatal(err)
			}
		})
	}
}

func TestMoveRejects(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, 0)
	base, _ := filled(t, d, 1<<16, 3)
	k := newKit(t, d, 4096)
	closed, err := d.NewHIPStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		s    *Stream
		segs []device.Seg
		p    device.Pinned
		want string
	}{
		{"lengths do not add up", k.s, segsOf(base, 0, 100), k.p, "segments add up to 100 B, pinned buffer is 4096 B"},
		{"segment end overflows", k.s, []device.Seg{{Addr: math.MaxUint64 - 10, Len: 4096}}, k.p, "segment 0 (0xfffffffffffffff5, 4096 B) overflows"},
		{"total overflows", k.s, []device.Seg{{Addr: base, Len: 1}, {Addr: 0, Len: math.MaxUint64}}, k.p, "segment 1 (0x0, 18446744073709551615 B) overflows"},
		{"not device memory", k.s, []device.Seg{{Addr: base + 1<<16, Len: 4096}}, k.p, "hipMemcpyAsync(D2H, 4096 B from"},
		{"closed stream", closed, segsOf(base, 0, 4096), k.p, "closed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.s.Gather(tc.p, tc.segs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Gather: %v, want an error saying %q", err, tc.want)
			}
		})
	}
	// A copy refused part-way: the copies before it were queued, so the
	// stream was drained before the error came back.
	segs := []device.Seg{{Addr: base, Len: 2048}, {Addr: base + 1<<16 - 100, Len: 2048}}
	err = k.s.Scatter(segs, k.p)
	var he *Error
	if !errors.As(err, &he) || he.Code != codeInvalidValue ||
		!strings.Contains(err.Error(), "[copy 2 of 2, Scatter of 4096 B] (copies already queued were waited for)") {
		t.Errorf("Scatter with a bad second block: %v", err)
	}
}

func TestEvents(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, 0)
	base, data := filled(t, d, 1<<16, 4)
	k := newKit(t, d, 1<<16)
	if got := hook(t, l, "fakehip_last_stream_flags"); got != streamNonBlocking {
		t.Errorf("stream flags %#x, want NonBlocking (0x1)", got)
	}
	if got := hook(t, l, "fakehip_last_event_flags"); got != eventDisableTiming {
		t.Errorf("event flags %#x, want DisableTiming (0x2)", got)
	}
	if done, err := k.ev.Query(); !done || err != nil {
		t.Errorf("Query of an event never recorded: (%v, %v), want (true, nil)", done, err)
	}
	hook(t, l, "fakehip_pause")
	if err := k.s.Gather(k.p, segsOf(base, 0, 1<<16)); err != nil {
		hook(t, l, "fakehip_resume")
		t.Fatal(err)
	}
	if err := k.s.Record(k.ev); err != nil {
		hook(t, l, "fakehip_resume")
		t.Fatal(err)
	}
	done, err := k.ev.Query()
	hook(t, l, "fakehip_resume")
	if done || err != nil {
		t.Errorf("Query while the copy is held: (%v, %v), want (false, nil)", done, err)
	}
	if err := k.ev.Wait(); err != nil {
		t.Fatal(err)
	}
	if done, err := k.ev.Query(); !done || err != nil {
		t.Errorf("Query after Wait: (%v, %v), want (true, nil)", done, err)
	}
	if msg := diff(k.p.Host(), data); msg != "" {
		t.Error(msg)
	}
	other, err := openDev(t, l, 0).NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := k.s.Record(other); err == nil || !strings.Contains(err.Error(), "not an event of this device") {
		t.Errorf("Record of another device's event: %v", err)
	}
}

// An injected copy failure reaches the next event and the stream, as the
// runtime's error.
func TestCopyFailure(t *testing.T) {
	t.Setenv("FAKEHIP_FAIL_COPY", "2")
	l := fakeLibrary(t)
	d := openDev(t, l, 0)
	base, _ := filled(t, d, 1<<16, 5)
	k := newKit(t, d, 1<<16)
	s, err := d.NewHIPStream() // its own: its Close reports the failure
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Gather(k.p, segsOf(base, 0, 1<<15, 1<<15+1, 1<<15-1, 1<<15, 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Record(k.ev); err != nil {
		t.Fatal(err)
	}
	const want = "hip: hipEventSynchronize: hipErrorIllegalAddress: an illegal memory access was encountered"
	if err := k.ev.Wait(); err == nil || err.Error() != want {
		t.Errorf("Wait: %v, want %q", err, want)
	}
	if done, err := k.ev.Query(); !done || code(err) != 700 {
		t.Errorf("Query: (%v, %v), want (true, code 700)", done, err)
	}
	if err := s.Synchronize(); code(err) != 700 {
		t.Errorf("Synchronize: %v, want code 700", err)
	}
	// Close reports the failure and still destroys the stream (the fake's
	// leak check at cleanup would see it otherwise).
	if err := s.Close(); code(err) != 700 || !strings.Contains(err.Error(), "hipStreamSynchronize(before destroy)") {
		t.Errorf("Close of the failed stream: %v, want the code 700 of its synchronize", err)
	}
}

// Each call makes the device current on whatever OS thread it runs on: a
// device 1 opened here allocates on device 1 from fresh threads too.
func TestCurrentDevicePerThread(t *testing.T) {
	t.Setenv("FAKEHIP_DEVICES", "2")
	l := fakeLibrary(t)
	d := openDev(t, l, 1)
	var wg sync.WaitGroup
	errs := make(chan string, 8*3) // at most three per goroutine
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // a thread of its own: its current device starts at 0
			a, err := d.AllocDevice(4096)
			if err != nil {
				errs <- err.Error()
				runtime.UnlockOSThread()
				return
			}
			if dev, _ := l.Call("fakehip_device_of", int64(a)); dev != 1 {
				errs <- fmt.Sprintf("allocation landed on device %d, want 1", dev)
			}
			p, err := d.AllocPinned(4096)
			if err == nil {
				if dev, _ := l.Call("fakehip_device_of", int64(uintptr(unsafe.Pointer(&p.Host()[0])))); dev != 1 {
					errs <- fmt.Sprintf("pinned buffer made on device %d, want 1", dev)
				}
				err = d.FreePinned(p)
			}
			if err == nil {
				err = d.FreeDevice(a)
			}
			if err != nil {
				errs <- err.Error()
			}
			// Exits with the thread locked: the runtime discards it.
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	s, err := d.NewHIPStream()
	if err != nil {
		t.Fatal(err)
	}
	if dev := hook(t, l, "fakehip_stream_device", int64(uintptr(s.s))); dev != 1 {
		t.Errorf("stream made on device %d, want 1", dev)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
}

func TestEnablePeerAccess(t *testing.T) {
	t.Setenv("FAKEHIP_DEVICES", "2")
	l := fakeLibrary(t)
	d := openDev(t, l, 0)
	for i, tc := range []struct {
		peer int
		code int
	}{{1, 0}, {1, 0 /* 704, already enabled, is success */}, {0, 101}, {2, 101}} {
		if err := d.EnablePeerAccess(tc.peer); code(err) != tc.code || (tc.code == 0) != (err == nil) {
			t.Errorf("call %d: EnablePeerAccess(%d): %v, want code %d", i, tc.peer, err, tc.code)
		}
	}
}

func TestCloseReportsLeaks(t *testing.T) {
	l := fakeLibrary(t)
	d, err := l.OpenDevice(0, Config{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.AllocPinned(4096)
	if err != nil {
		t.Fatal(err)
	}
	err = d.Close()
	if err == nil || !strings.Contains(err.Error(), "Close with resources still open: 1 stream(s), 1 pinned buffer(s)") {
		t.Errorf("Close with a stream and a pinned buffer open: %v", err)
	}
	if err := s.Close(); !errors.Is(err, device.ErrClosed) {
		t.Errorf("Stream.Close after Device.Close: %v, want ErrClosed", err)
	}
	// The fake still holds them: release them behind the closed device so
	// the leak check passes.
	reopen := openDev(t, l, 0)
	reopen.pinned.Add(&reopen.core, p.Host(), struct{}{})
	reopen.core.Count(&reopen.core.Streams, 1)
	if err := reopen.FreePinned(p); err != nil {
		t.Error(err)
	}
	s.(*Stream).d = reopen
	s.(*Stream).gate = vendorkit.Gate{}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
}
