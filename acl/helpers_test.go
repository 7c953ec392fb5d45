package acl

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"go.uber.org/goleak"
)

// Helpers shared by the CPU tests (against testdata/fakeacl.c) and the GPU
// tests (build tag gpu, against testdata/fakeacl_cuda.c). The gather/
// scatter checks and the layouts they move are device/devicetest's, shared
// by every backend.

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
	// config.EnvName of device.acl.library and .copy_mode, spelled out:
	// config imports this package, so its tests cannot import config.
	env := []string{"STAGE_DEVICE_ACL_LIBRARY=" + so}
	if mode != CopyAuto {
		env = append(env, "STAGE_DEVICE_ACL_COPY_MODE="+string(mode))
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

// buildFake compiles testdata/fakeacl.c with flags (and testdata on the
// include path, for fakeacl_common.h).
func buildFake(t testing.TB, flags ...string) string {
	t.Helper()
	src, err := os.ReadFile("testdata/fakeacl.c")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	return buildSO(t, "libascendcl.so", string(src), append([]string{"-I" + dir}, flags...)...)
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
		n, err := l.Call("fakeacl_live")
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
	n, err := l.Call(name)
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

// unsafePointer is the address of b's first byte.
func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
