package hip

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/stage-kv/stage/device"
)

// The tests run against testdata/fakehip.c, built with gcc into a shared
// library per test (each test gets its own copy, so its own runtime state),
// and check after each test that the fake holds nothing: no device or
// pinned memory, no open IPC handle, no stream, no event.

var fakeKnobs = []string{childLibraryEnv, "FAKEHIP_DEVICES", "FAKEHIP_INIT_ERR", "FAKEHIP_FAIL_COPY", "FAKEHIP_HOST_LIMIT", "FAKEHIP_NO_DEVICE_POINTER"}

func TestMain(m *testing.M) {
	// A developer's shell must not turn the emulation's knobs on for
	// every test (the cross-process child gets its settings explicitly).
	if os.Getenv(childEnv) == "" {
		for _, k := range fakeKnobs {
			os.Unsetenv(k)
		}
	}
	code := m.Run()
	builds.cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// soCache compiles each (source, flags) once per test binary.
type soCache struct {
	mu   sync.Mutex
	dir  string
	libs map[string]string
}

var builds soCache

func (c *soCache) cleanup() {
	if c.dir != "" {
		os.RemoveAll(c.dir)
	}
}

// get returns the path of src compiled with flags, compiling it on first
// use; it skips the test when gcc is missing.
func (c *soCache) get(t testing.TB, src string, flags ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc not found (%v): cannot build the emulated libamdhip64", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	id := src + "\x00" + strings.Join(flags, " ")
	if so, ok := c.libs[id]; ok {
		return so
	}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "fakehip-"); err != nil {
			t.Fatal(err)
		}
		c.libs = map[string]string{}
	}
	n := len(c.libs)
	cfile := filepath.Join(c.dir, fmt.Sprintf("src%d.c", n))
	so := filepath.Join(c.dir, fmt.Sprintf("lib%d.so", n))
	if err := os.WriteFile(cfile, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", so, cfile}, flags...)
	if out, err := exec.Command(gcc, append(args, "-lpthread")...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	c.libs[id] = so
	return so
}

// buildLib compiles src (cached) and copies the result into the test's
// temp dir as libamdhip64.so: a path of its own gives the test a runtime
// of its own when dlopen'd.
func buildLib(t testing.TB, src string, flags ...string) string {
	t.Helper()
	b, err := os.ReadFile(builds.get(t, src, flags...))
	if err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(t.TempDir(), "libamdhip64.so")
	if err := os.WriteFile(so, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return so
}

// buildFake builds testdata/fakehip.c with flags.
func buildFake(t testing.TB, flags ...string) string {
	t.Helper()
	src, err := os.ReadFile("testdata/fakehip.c")
	if err != nil {
		t.Fatal(err)
	}
	return buildLib(t, string(src), flags...)
}

// fakeLibrary builds and opens the emulation; the test fails if the fake
// still holds anything at cleanup.
func fakeLibrary(t *testing.T, flags ...string) *Library {
	t.Helper()
	return openFake(t, buildFake(t, flags...))
}

func openFake(t *testing.T, so string) *Library {
	t.Helper()
	l, err := OpenLibrary(so)
	if err != nil {
		t.Fatalf("OpenLibrary(fake): %v", err)
	}
	t.Cleanup(func() {
		if n := hook(t, l, "fakehip_live"); n != 0 {
			t.Errorf("fake libamdhip64: %d allocations, mappings, streams or events still live after the test", n)
			return // left loaded: a leaked stream's thread still runs its code
		}
		if err := l.Close(); err != nil {
			t.Errorf("Library.Close: %v", err)
		}
	})
	return l
}

// hook calls one of the fake's test hooks.
func hook(t testing.TB, l *Library, name string, arg ...int64) int64 {
	t.Helper()
	n, err := l.Call(name, arg...)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// openDev opens device ordinal and closes it when the test ends, failing
// the test if anything was still open then.
func openDev(t *testing.T, l *Library, ordinal int) *Device {
	t.Helper()
	d, err := l.OpenDevice(ordinal, Config{Logf: t.Logf})
	if err != nil {
		t.Fatalf("OpenDevice(%d): %v", ordinal, err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Device.Close: %v", err)
		}
	})
	return d
}

// pattern returns n bytes drawn from seed.
func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// filled allocates n bytes of device memory holding pattern(seed, n), freed
// at cleanup.
func filled(t testing.TB, d *Device, n int, seed uint64) (device.Addr, []byte) {
	t.Helper()
	a, err := d.AllocDevice(uint64(n))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.FreeDevice(a); err != nil {
			t.Errorf("FreeDevice(%#x): %v", uint64(a), err)
		}
	})
	b := pattern(seed, n)
	if err := d.CopyHtoD(a, b); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// readDev copies n bytes at a back to the host.
func readDev(t testing.TB, d *Device, a device.Addr, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if err := d.CopyDtoH(b, a); err != nil {
		t.Fatal(err)
	}
	return b
}

// diff describes the first byte where got and want differ, or "".
func diff(got, want []byte) string {
	if bytes.Equal(got, want) {
		return ""
	}
	if len(got) != len(want) {
		return fmt.Sprintf("got %d B, want %d B", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Sprintf("byte %d is %#02x, want %#02x", i, got[i], want[i])
		}
	}
	return ""
}

// kit is a stream, an event and a pinned buffer of n bytes, closed at
// cleanup with their errors checked.
type kit struct {
	s  *Stream
	ev device.Event
	p  device.Pinned
}

func newKit(t *testing.T, d *Device, n int) kit {
	t.Helper()
	s, err := d.NewHIPStream()
	if err != nil {
		t.Fatal(err)
	}
	ev, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.AllocPinned(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for what, err := range map[string]error{"FreePinned": d.FreePinned(p), "Event.Close": ev.Close(), "Stream.Close": s.Close()} {
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
	})
	return kit{s: s, ev: ev, p: p}
}

// gather runs one Gather of segs into k.p (its first SegsLen bytes) and
// waits for it.
func (k kit) gather(t *testing.T, segs []device.Seg) []byte {
	t.Helper()
	dst := k.p.Slice(0, int(device.SegsLen(segs)))
	if err := k.s.Gather(dst, segs); err != nil {
		t.Fatalf("Gather: %v", err)
	}
	if err := k.s.Record(k.ev); err != nil {
		t.Fatal(err)
	}
	if err := k.ev.Wait(); err != nil {
		t.Fatalf("Wait after Gather: %v", err)
	}
	return dst.Host()
}

// scatter copies src into k.p and scatters it into segs, waiting for it.
func (k kit) scatter(t *testing.T, segs []device.Seg, src []byte) {
	t.Helper()
	p := k.p.Slice(0, len(src))
	copy(p.Host(), src)
	if err := k.s.Scatter(segs, p); err != nil {
		t.Fatalf("Scatter: %v", err)
	}
	if err := k.s.Synchronize(); err != nil {
		t.Fatalf("Synchronize after Scatter: %v", err)
	}
}
