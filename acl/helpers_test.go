package acl

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
	"unsafe"

	"go.uber.org/goleak"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/device"
)

// Helpers shared by the CPU tests (against testdata/fakeacl.c) and the GPU
// tests (build tag gpu, against testdata/fakeacl_cuda.c).

func TestMain(m *testing.M) {
	// Knobs of the emulation come from the environment; a developer's
	// shell must not turn them on for every test.
	for _, k := range []string{testCopyModeEnv, "FAKEACL_FAIL_COPY", "FAKEACL_BATCH_UNSUPPORTED", "FAKEACL_NO_HOST_REGISTER",
		"FAKEACL_INIT_ERR", "FAKEACL_STREAM_CONFIG_ERR", "FAKEACL_DEVICES"} {
		os.Unsetenv(k)
	}
	code := m.Run()
	removeStagedBuild()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Test-only environment (STAGE_TEST_*, never a config key): the emulated
// runtime a GPU test or a child process opens, and its copy mode.
const (
	testLibraryEnv  = "STAGE_TEST_ACL_LIBRARY"
	testCopyModeEnv = "STAGE_TEST_ACL_COPY_MODE"
)

// stagedEnv is the environment that makes a staged open the acl backend
// over the library so, in copy mode mode.
func stagedEnv(so string, mode CopyMode) []string {
	env := []string{config.EnvName("device.acl.library") + "=" + so}
	if mode != CopyAuto {
		env = append(env, config.EnvName("device.acl.copy_mode")+"="+string(mode))
	}
	return env
}

// buildSO compiles C source into a shared library in a temp dir, or skips
// the test when gcc is missing.
func buildSO(t testing.TB, name, src string, flags ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc not found (%v): cannot build an emulated libascendcl", err)
	}
	dir := t.TempDir()
	c := filepath.Join(dir, "fake.c")
	so := filepath.Join(dir, name)
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", so, c}, flags...)
	args = append(args, "-lpthread")
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return so
}

// buildFake compiles testdata/fakeacl.c with flags.
func buildFake(t testing.TB, flags ...string) string {
	t.Helper()
	src, err := os.ReadFile("testdata/fakeacl.c")
	if err != nil {
		t.Fatal(err)
	}
	return buildSO(t, "libascendcl.so", string(src), flags...)
}

// fakeLibrary builds and opens the emulation; the test fails if the fake
// still holds anything (memory, streams, events, device references) at
// cleanup.
func fakeLibrary(t *testing.T, flags ...string) *Library {
	t.Helper()
	return openFakeSO(t, buildFake(t, flags...), true)
}

func openFakeSO(t *testing.T, so string, checkLeaks bool) *Library {
	t.Helper()
	l, err := OpenLibrary(so)
	if err != nil {
		t.Fatalf("OpenLibrary(fake): %v", err)
	}
	t.Cleanup(func() {
		n, err := l.h.Call("fakeacl_live")
		if err == nil && n == 0 {
			l.Close()
			return
		}
		if checkLeaks {
			t.Errorf("fake libascendcl: %d resources still live after the test (%v)", n, err)
		}
		// Left loaded: a leaked stream's thread still runs its code.
	})
	return l
}

// counter reads one of the fake's counters.
func counter(t testing.TB, l *Library, name string) int64 {
	t.Helper()
	n, err := l.h.Call(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// logSink collects a device's log lines.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (s *logSink) logf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, fmt.Sprintf(format, args...))
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

// openDev opens device 0 and closes it when the test ends, failing the test
// if anything was still open then.
func openDev(t *testing.T, l *Library, cfg Config) *Device {
	t.Helper()
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	d, err := l.OpenDevice(0, cfg)
	if err != nil {
		t.Fatalf("OpenDevice(%+v): %v", cfg.CopyMode, err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

// randBytes returns n pseudo-random bytes from seed.
func randBytes(seed uint64, n int) []byte {
	var key [32]byte
	for i := range 8 {
		key[i] = byte(seed >> (8 * i))
	}
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	return b
}

// poison fills b with a pattern no copy produces by chance.
func poison(b []byte, tag byte) {
	for i := range b {
		b[i] = tag ^ byte(i*7)
	}
}

// devicePool allocates n bytes of device memory holding random bytes.
func devicePool(t testing.TB, d *Device, n int, seed uint64) (device.Addr, []byte) {
	t.Helper()
	pool, err := d.AllocDevice(uint64(n))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.FreeDevice(pool); err != nil {
			t.Errorf("FreeDevice: %v", err)
		}
	})
	data := randBytes(seed, n)
	if err := d.CopyHtoD(pool, data); err != nil {
		t.Fatal(err)
	}
	return pool, data
}

// layout picks n non-overlapping segments of [base, base+size) in random
// order: the pool is cut into n cells, each holds one segment at a random
// offset with a length from lenFn, clipped to its cell.
func layout(rng *rand.Rand, base device.Addr, size uint64, n int, lenFn func() uint64) []device.Seg {
	cell := size / uint64(n)
	segs := make([]device.Seg, 0, n)
	for i := range n {
		l := min(lenFn(), cell)
		off := uint64(0)
		if room := cell - l; room > 0 {
			off = rng.Uint64N(room + 1)
		}
		segs = append(segs, device.Seg{Addr: base + device.Addr(uint64(i)*cell+off), Len: l})
	}
	rng.Shuffle(len(segs), func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
	return segs
}

// blockSegs picks n distinct blocks of bs bytes of the pool in random order.
func blockSegs(rng *rand.Rand, base device.Addr, size uint64, n int, bs uint64) []device.Seg {
	perm := rng.Perm(int(size / bs))
	segs := make([]device.Seg, n)
	for i := range segs {
		segs[i] = device.Seg{Addr: base + device.Addr(uint64(perm[i])*bs), Len: bs}
	}
	return segs
}

// oddLens draws lengths around powers of two and pages.
func oddLens(rng *rand.Rand) func() uint64 {
	choices := []uint64{1, 2, 3, 15, 16, 17, 63, 64, 65, 4095, 4096, 4097, 16383, 16384, 65535, 65536 + 7, 200003}
	return func() uint64 { return choices[rng.IntN(len(choices))] }
}

// gathered is what a gather of segs out of pool (holding data) produces.
func gathered(data []byte, pool device.Addr, segs []device.Seg) []byte {
	var out []byte
	for _, sg := range segs {
		off := uint64(sg.Addr - pool)
		out = append(out, data[off:off+sg.Len]...)
	}
	return out
}

func mismatch(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// firstDiff reports the first byte where a gathered buffer differs, with
// the segment it belongs to.
func firstDiff(got, want []byte, segs []device.Seg) error {
	i := mismatch(got, want)
	if i < 0 {
		return nil
	}
	o := 0
	for k, sg := range segs {
		if i < o+int(sg.Len) {
			return fmt.Errorf("byte %d is %#02x, want %#02x (segment %d: %#x+%d, %d B)", i, got[i], want[i], k, uint64(sg.Addr), i-o, sg.Len)
		}
		o += int(sg.Len)
	}
	return fmt.Errorf("byte %d differs", i)
}

// checkGatherScatter gathers segs (inside pool, whose bytes are data) into
// a fresh pinned buffer and checks every byte, then scatters new bytes back
// into the poisoned pool and checks that the segments got them and nothing
// else changed. It restores pool to data before returning.
func checkGatherScatter(t *testing.T, d *Device, pool device.Addr, data []byte, segs []device.Seg, seed uint64) {
	t.Helper()
	total := device.SegsLen(segs)
	p, err := d.AllocPinned(int(total))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.FreePinned(p); err != nil {
			t.Error(err)
		}
	}()
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	ev, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ev.Close(); err != nil {
			t.Error(err)
		}
	}()

	poison(p.Host(), 0xA5)
	if err := s.Gather(p, segs); err != nil {
		t.Fatalf("Gather: %v", err)
	}
	if err := s.Record(ev); err != nil {
		t.Fatal(err)
	}
	if err := ev.Wait(); err != nil {
		t.Fatalf("Wait after Gather: %v", err)
	}
	if done, err := ev.Query(); !done || err != nil {
		t.Fatalf("Query after Wait: got (%v, %v), want (true, nil)", done, err)
	}
	if err := firstDiff(p.Host(), gathered(data, pool, segs), segs); err != nil {
		t.Fatalf("Gather of %d segments (%d B): %v", len(segs), total, err)
	}

	src := randBytes(seed^0x5ca77e12, int(total))
	copy(p.Host(), src)
	poisoned := make([]byte, len(data))
	poison(poisoned, 0x3C)
	if err := d.CopyHtoD(pool, poisoned); err != nil {
		t.Fatal(err)
	}
	if err := s.Scatter(segs, p); err != nil {
		t.Fatalf("Scatter: %v", err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatalf("Synchronize after Scatter: %v", err)
	}
	got := make([]byte, len(data))
	if err := d.CopyDtoH(got, pool); err != nil {
		t.Fatal(err)
	}
	want := poisoned
	o := uint64(0)
	for _, sg := range segs {
		off := uint64(sg.Addr - pool)
		copy(want[off:off+sg.Len], src[o:o+sg.Len])
		o += sg.Len
	}
	if i := mismatch(got, want); i >= 0 {
		t.Fatalf("Scatter of %d segments (%d B): pool byte %d is %#02x, want %#02x", len(segs), total, i, got[i], want[i])
	}
	if err := d.CopyHtoD(pool, data); err != nil {
		t.Fatal(err)
	}
}

// unsafePointer is the address of b's first byte.
func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
