package dl

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

// buildLib compiles src into a shared library, or skips without gcc.
func buildLib(t *testing.T, src string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc not found: %v", err)
	}
	dir := t.TempDir()
	c, so := filepath.Join(dir, "lib.c"), filepath.Join(dir, "libt.so")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", so, c).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return so
}

func TestOpenErrorNamesPathAndCause(t *testing.T) {
	cases := []struct {
		name string
		path func(t *testing.T) string
		want string // in dlerror's text
	}{
		{"missing file", func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope.so") }, "No such file"},
		{"not a library", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "text.so")
			if err := os.WriteFile(p, []byte("not an ELF file"), 0o644); err != nil {
				t.Fatal(err)
			}
			return p
		}, "text.so"},
		{"unresolved symbol", func(t *testing.T) string {
			return buildLib(t, "extern int stage_nowhere(void); int f(void) { return stage_nowhere(); }\n")
		}, "stage_nowhere"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.path(t)
			h, err := Open(p)
			if err == nil {
				h.Close()
				t.Fatalf("Open(%s) succeeded", p)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "dlopen "+p+": ") || !strings.Contains(msg, tc.want) {
				t.Errorf("got %q, want \"dlopen %s: ...%s...\"", msg, p, tc.want)
			}
		})
	}
}

// Loader errors of goroutines moving between threads must each carry their
// own text: the shim reads dlerror in the call that failed.
func TestOpenErrorsConcurrent(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := filepath.Join(dir, "lib"+strings.Repeat("x", i)+".so")
			runtime.Gosched()
			_, err := Open(p)
			if err == nil || !strings.Contains(err.Error(), p+": "+p) {
				errs <- errors.New("Open(" + p + "): " + errorString(err))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func errorString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func TestBindAndCall(t *testing.T) {
	so := buildLib(t, "long one(void) { return 1; }\nlong twice(long a) { return 2*a; }\n")
	h, err := Open(so)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := h.Close(); err != nil {
			t.Error(err)
		}
	}()
	table := []Sym{{"one", Required}, {"gone", Required}, {"twice", 1}, {"later", 1}, {"other", 2}}
	var set []int
	missing := h.Bind(table, func(i int, p unsafe.Pointer) {
		if p == nil {
			t.Errorf("set(%d) with nil", i)
		}
		set = append(set, i)
	})
	if !slices.Equal(set, []int{0, 2}) {
		t.Errorf("set called for %v, want [0 2]", set)
	}
	want := map[int][]string{Required: {"gone"}, 1: {"later"}, 2: {"other"}}
	for g, names := range want {
		if !slices.Equal(missing[g], names) {
			t.Errorf("missing[%d] = %v, want %v", g, missing[g], names)
		}
	}
	if n, err := h.Call("twice", 21); err != nil || n != 42 {
		t.Errorf("Call(twice, 21) = %d, %v", n, err)
	}
	if _, err := h.Call("gone"); err == nil || !strings.Contains(err.Error(), "no symbol gone") {
		t.Errorf("Call(gone): got %v", err)
	}
	err = MissingError("cuda", so, missing[Required], "driver too old?")
	if got, w := err.Error(), "cuda: "+so+": missing gone; driver too old?"; got != w {
		t.Errorf("MissingError = %q, want %q", got, w)
	}
}

func TestAbsent(t *testing.T) {
	a := Absent{"b": "costs b", "a": "costs a"}
	if got := a.List(); !slices.Equal(got, []string{"a: costs a", "b: costs b"}) {
		t.Errorf("List = %v", got)
	}
	c := a.Copy()
	c["a"] = "changed"
	if a["a"] != "costs a" {
		t.Error("Copy shares the map")
	}
}

func TestErrorText(t *testing.T) {
	cases := []struct{ lib, op, name, msg, want string }{
		{"cuda", "cuInit", "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected", "cuda: cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected"},
		{"hip", "hipEventQuery", "hipErrorNotReady", "hipErrorNotReady", "hip: hipEventQuery: hipErrorNotReady"},
		{"acl", "aclInit(NULL)", "aclError(1)", "", "acl: aclInit(NULL): aclError(1)"},
	}
	for _, tc := range cases {
		if got := ErrorText(tc.lib, tc.op, tc.name, tc.msg); got != tc.want {
			t.Errorf("ErrorText(%q, %q, %q, %q) = %q, want %q", tc.lib, tc.op, tc.name, tc.msg, got, tc.want)
		}
	}
}
