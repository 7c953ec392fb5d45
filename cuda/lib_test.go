package cuda

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/internal/dl"
)

func TestRegistered(t *testing.T) {
	if !slices.Contains(device.Kinds(), device.KindCUDA) {
		t.Fatalf("device.Kinds() = %v, want it to include %q", device.Kinds(), device.KindCUDA)
	}
}

func TestOpenLibraryNotFound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nonexistent", "libcuda.so.1")
	_, err := OpenLibrary(path)
	if err == nil {
		t.Fatal("OpenLibrary of a missing file succeeded")
	}
	msg := err.Error()
	wantPrefix := "cuda: dlopen " + path + ": "
	wantSuffix := "; is the NVIDIA driver installed and visible in this container (or device.cuda.library set)?"
	if !strings.HasPrefix(msg, wantPrefix) || !strings.HasSuffix(msg, wantSuffix) {
		t.Fatalf("got %q, want %q<dlerror>%q", msg, wantPrefix, wantSuffix)
	}
	if inner := strings.TrimSuffix(strings.TrimPrefix(msg, wantPrefix), wantSuffix); !strings.Contains(inner, "No such file") {
		t.Errorf("dlerror text %q does not say the file is missing", inner)
	}
}

func TestOpenHonorsOptionsLibrary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libcuda-from-config.so.1")
	_, err := device.Open(device.KindCUDA, 0, device.Options{Backend: Config{Library: path}})
	if err == nil || !strings.Contains(err.Error(), "cuda: dlopen "+path+": ") {
		t.Fatalf("device.Open with CUDA.Library=%s: got %v, want a dlopen error naming it", path, err)
	}
}

func TestOpenLibraryMissingSymbols(t *testing.T) {
	so := buildSO(t, `
int cuInit(unsigned flags) { (void)flags; return 0; }
int cuGetErrorName(int r, const char **s) { (void)r; *s = "CUDA_SUCCESS"; return 0; }
`)
	_, err := OpenLibrary(so)
	if err == nil {
		t.Fatal("OpenLibrary of a library with two symbols succeeded")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "cuda: "+so+": missing ") || !strings.HasSuffix(msg, "; driver too old?") {
		t.Fatalf("got %q, want \"cuda: %s: missing ...; driver too old?\"", msg, so)
	}
	listed := strings.Split(strings.TrimSuffix(strings.TrimPrefix(msg, "cuda: "+so+": missing "), "; driver too old?"), ", ")
	var want []string
	for _, s := range symbols() {
		if s.Group == dl.Required && s.Name != "cuInit" && s.Name != "cuGetErrorName" {
			want = append(want, s.Name)
		}
	}
	if !slices.Equal(listed, want) {
		t.Errorf("missing list:\n got %v\nwant %v", listed, want)
	}
	for _, s := range []string{"cuMemAlloc_v2", "cuIpcOpenMemHandle_v2", "cuMemcpyDtoHAsync_v2", "cuLaunchKernel"} {
		if !slices.Contains(listed, s) {
			t.Errorf("missing list lacks %s", s)
		}
	}
}

func TestSymbolTable(t *testing.T) {
	seen := map[string]bool{}
	var optional []string
	for _, s := range symbols() {
		if seen[s.Name] {
			t.Errorf("symbol %s bound twice", s.Name)
		}
		seen[s.Name] = true
		if s.Group != dl.Required {
			optional = append(optional, s.Name)
		}
	}
	// The versioned exports REFERENCE.md names must be what we bind.
	for _, s := range []string{"cuMemAlloc_v2", "cuMemFree_v2", "cuMemHostGetDevicePointer_v2", "cuMemHostRegister_v2",
		"cuMemGetAddressRange_v2", "cuIpcOpenMemHandle_v2", "cuDevicePrimaryCtxRelease_v2", "cuStreamDestroy_v2",
		"cuEventDestroy_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync_v2"} {
		if !seen[s] {
			t.Errorf("%s is not bound", s)
		}
		if un := strings.TrimSuffix(s, "_v2"); seen[un] {
			t.Errorf("unversioned %s bound beside %s", un, s)
		}
	}
	for _, s := range []string{"cuMemcpyBatchAsync_v2", "cuMemcpyBatchAsync", "cuMemCreate", "cuMemImportFromShareableHandle"} {
		if !slices.Contains(optional, s) {
			t.Errorf("%s should be optional", s)
		}
	}
}

func TestError(t *testing.T) {
	e := &Error{Op: "cuMemcpyDtoHAsync(4194304 B from 0x7f0000000000)", Code: 700, Name: "CUDA_ERROR_ILLEGAL_ADDRESS", Msg: "an illegal memory access was encountered"}
	want := "cuda: cuMemcpyDtoHAsync(4194304 B from 0x7f0000000000): CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered"
	if e.Error() != want {
		t.Errorf("got %q, want %q", e.Error(), want)
	}
	tests := []struct {
		code                     int
		oom, notSupported, ready bool
	}{
		{2, true, false, false},
		{800, false, true, false},
		{801, false, true, false},
		{600, false, false, true},
		{700, false, false, false},
		{1, false, false, false},
	}
	for _, tc := range tests {
		var err error = &Error{Op: "x", Code: tc.code, Name: "N"}
		wrapped := errors.Join(errors.New("context"), err)
		if got := errors.Is(wrapped, device.ErrOutOfMemory); got != tc.oom {
			t.Errorf("code %d: Is(ErrOutOfMemory) = %v, want %v", tc.code, got, tc.oom)
		}
		if got := errors.Is(wrapped, device.ErrNotSupported); got != tc.notSupported {
			t.Errorf("code %d: Is(ErrNotSupported) = %v, want %v", tc.code, got, tc.notSupported)
		}
		if got := errors.Is(wrapped, device.ErrNotReady); got != tc.ready {
			t.Errorf("code %d: Is(ErrNotReady) = %v, want %v", tc.code, got, tc.ready)
		}
	}
	if got := (&Error{Op: "cuInit", Code: 999, Name: "CUresult(999)"}).Error(); got != "cuda: cuInit: CUresult(999)" {
		t.Errorf("no message: got %q", got)
	}
}
