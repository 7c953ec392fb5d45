package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Helpers shared by the CPU tests (against testdata/fakecuda.c) and the GPU
// tests (build tag gpu). The gather/scatter checks and the layouts they
// move are device/devicetest's, shared by every backend.

// buildSO compiles C source into a shared library in a temp dir, or skips
// the test when gcc is missing.
func buildSO(t testing.TB, src string, flags ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc not found (%v): cannot build a fake libcuda", err)
	}
	dir := t.TempDir()
	c := filepath.Join(dir, "fake.c")
	so := filepath.Join(dir, "libcuda.so.1")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-o", so, c}, flags...)
	args = append(args, "-lpthread")
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return so
}
