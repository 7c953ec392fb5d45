package hip

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stage-kv/stage/device"
)

func TestRegistered(t *testing.T) {
	if !slices.Contains(device.Kinds(), device.KindHIP) {
		t.Fatalf("device.Kinds() = %v, want it to include %q", device.Kinds(), device.KindHIP)
	}
}

func TestOpenLibraryNotFound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nonexistent", "libamdhip64.so")
	_, err := OpenLibrary(path)
	if err == nil {
		t.Fatal("OpenLibrary of a missing file succeeded")
	}
	msg := err.Error()
	prefix := "hip: dlopen " + path + ": "
	suffix := "; is ROCm installed (libamdhip64.so on the loader path, e.g. /opt/rocm/lib) or device.hip.library set?"
	if !strings.HasPrefix(msg, prefix) || !strings.HasSuffix(msg, suffix) {
		t.Fatalf("got %q, want %q<dlerror>%q", msg, prefix, suffix)
	}
	if inner := strings.TrimSuffix(strings.TrimPrefix(msg, prefix), suffix); !strings.Contains(inner, "No such file") {
		t.Errorf("dlerror text %q does not say the file is missing", inner)
	}
}

// The registered opener loads device.hip.library (a Config in Options.Backend)
// when a device is opened, not before.
func TestOpenHonorsOptionsLibrary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libamdhip64-from-config.so")
	_, err := device.Open(device.KindHIP, 0, device.Options{Backend: Config{Library: path}})
	if err == nil || !strings.Contains(err.Error(), "hip: dlopen "+path+": ") {
		t.Fatalf("device.Open with HIP.Library=%s: got %v, want a dlopen error naming it", path, err)
	}

	so := buildFake(t)
	dev, err := device.Open(device.KindHIP, 0, device.Options{Backend: Config{Library: so}})
	if err != nil {
		t.Fatalf("device.Open with HIP.Library=<fake>: %v", err)
	}
	if dev.Kind() != device.KindHIP || dev.String() != "hip:0" {
		t.Errorf("opened %s of kind %s, want hip:0 of kind hip", dev, dev.Kind())
	}
	if err := dev.Close(); err != nil {
		t.Error(err)
	}
	l, err := SharedLibrary(so)
	if err != nil || l.Path() != so {
		t.Fatalf("SharedLibrary(%s) = %v, %v; want the library at that path", so, l, err)
	}
	if err := l.Close(); err != nil {
		t.Error(err)
	}
}

func TestOpenLibraryMissingSymbols(t *testing.T) {
	so := buildLib(t, `
int hipInit(unsigned f) { (void)f; return 0; }
const char *hipGetErrorName(int e) { (void)e; return "x"; }
int hipDeviceEnablePeerAccess(int p, unsigned f) { (void)p; (void)f; return 0; }
`)
	_, err := OpenLibrary(so)
	if err == nil {
		t.Fatal("OpenLibrary of a library with three symbols succeeded")
	}
	msg := err.Error()
	prefix, suffix := "hip: "+so+": missing ", "; ROCm too old, or not libamdhip64?"
	if !strings.HasPrefix(msg, prefix) || !strings.HasSuffix(msg, suffix) {
		t.Fatalf("got %q, want %q...%q", msg, prefix, suffix)
	}
	listed := strings.Split(strings.TrimSuffix(strings.TrimPrefix(msg, prefix), suffix), ", ")
	var want []string
	for _, s := range symbols() {
		if s.Group == 0 && s.Name != "hipInit" && s.Name != "hipGetErrorName" {
			want = append(want, s.Name)
		}
	}
	if !slices.Equal(listed, want) {
		t.Errorf("missing list:\n got %v\nwant %v", listed, want)
	}
}

func TestOptionalPeerAccessAbsent(t *testing.T) {
	l := fakeLibrary(t, "-DFAKEHIP_NO_PEER")
	abs := l.AbsentList()
	if len(abs) != 1 || !strings.HasPrefix(abs[0], "hipDeviceEnablePeerAccess: ") || len(l.Absent()) != 1 {
		t.Fatalf("Absent() = %q, want hipDeviceEnablePeerAccess with its cost", abs)
	}
	d := openDev(t, l, 0)
	if err := d.EnablePeerAccess(1); !errors.Is(err, device.ErrNotSupported) {
		t.Errorf("EnablePeerAccess without the export: %v, want ErrNotSupported", err)
	}
}

// Every bound symbol carries its C prototype in a comment in shim.h, and
// the IPC open takes the handle by value.
func TestSymbolPrototypes(t *testing.T) {
	src, err := os.ReadFile("shim.h")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range symbols() {
		if seen[s.Name] {
			t.Errorf("%s bound twice", s.Name)
		}
		seen[s.Name] = true
		re := regexp.MustCompile(`/\* (hipError_t |const char \*)` + s.Name + `\(`)
		if !re.Match(src) {
			t.Errorf("shim.h has no prototype comment for %s", s.Name)
		}
	}
	if !strings.Contains(string(src), "hipIpcOpenMemHandle)(void **, hipIpcMemHandle_t, unsigned int)") {
		t.Error("hipIpcOpenMemHandle is not bound with the handle by value")
	}
	for _, want := range []string{"hipIpcOpenMemHandle", "hipMemGetAddressRange", "hipHostGetDevicePointer", "hipEventQuery"} {
		if !seen[want] {
			t.Errorf("%s is not bound", want)
		}
	}
}

func TestError(t *testing.T) {
	tests := []struct {
		err                        *Error
		want                       string
		oom, unsupported, notReady bool
	}{
		{&Error{Op: "hipMemcpyAsync(D2H, 4194304 B from 0x1000)", Code: 1, Name: "hipErrorInvalidValue", Msg: "invalid argument"},
			"hip: hipMemcpyAsync(D2H, 4194304 B from 0x1000): hipErrorInvalidValue: invalid argument", false, false, false},
		{&Error{Op: "hipHostMalloc(1 B, PORTABLE|MAPPED)", Code: 2, Name: "hipErrorOutOfMemory"},
			"hip: hipHostMalloc(1 B, PORTABLE|MAPPED): hipErrorOutOfMemory", true, false, false},
		{&Error{Op: "hipEventQuery", Code: 600, Name: "hipErrorNotReady", Msg: "hipErrorNotReady"},
			"hip: hipEventQuery: hipErrorNotReady", false, false, true},
		{&Error{Op: "x", Code: 801, Name: "hipErrorNotSupported", Msg: "operation not supported"},
			"hip: x: hipErrorNotSupported: operation not supported", false, true, false},
		{&Error{Op: "x", Code: 217, Name: "hipError_t(217)"}, "hip: x: hipError_t(217)", false, true, false},
		{&Error{Op: "x", Code: 704, Name: "hipError_t(704)"}, "hip: x: hipError_t(704)", false, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("Error() = %q, want %q", got, tc.want)
			}
			for _, c := range []struct {
				target error
				want   bool
			}{{device.ErrOutOfMemory, tc.oom}, {device.ErrNotSupported, tc.unsupported}, {device.ErrNotReady, tc.notReady}, {device.ErrBadHandle, false}} {
				if got := errors.Is(tc.err, c.target); got != c.want {
					t.Errorf("errors.Is(code %d, %v) = %v, want %v", tc.err.Code, c.target, got, c.want)
				}
			}
		})
	}
}

func TestOpenDeviceErrors(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		ordinal int
		want    string
		code    int
	}{
		{"init fails", map[string]string{"FAKEHIP_INIT_ERR": "100"}, 0, "hip: hipInit(0): hipErrorUnknown", 100},
		{"ordinal past the count", map[string]string{"FAKEHIP_DEVICES": "2"}, 2, "hip: device 2: this process sees 2 GPUs", 0},
		{"negative ordinal", nil, -1, "hip: device -1: this process sees 1 GPUs", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			l := fakeLibrary(t)
			d, err := l.OpenDevice(tc.ordinal, Config{Logf: t.Logf})
			if err == nil {
				d.Close()
				t.Fatal("OpenDevice succeeded")
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("got %q, want it to start with %q", err, tc.want)
			}
			if code(err) != tc.code {
				t.Errorf("code %d, want %d", code(err), tc.code)
			}
		})
	}
}
