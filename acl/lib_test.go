package acl

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stage-kv/stage/device"
)

func TestRegistered(t *testing.T) {
	if !slices.Contains(device.Kinds(), device.KindACL) {
		t.Fatalf("device.Kinds() = %v, want it to include %q", device.Kinds(), device.KindACL)
	}
}

func TestOpenLibraryNotFound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nonexistent", "libascendcl.so")
	_, err := OpenLibrary(path)
	if err == nil {
		t.Fatal("OpenLibrary of a missing file succeeded")
	}
	msg := err.Error()
	wantPrefix := "acl: dlopen " + path + ": "
	wantSuffix := "; is CANN installed (source its set_env.sh so libascendcl.so is on LD_LIBRARY_PATH) or device.acl.library set?"
	if !strings.HasPrefix(msg, wantPrefix) || !strings.HasSuffix(msg, wantSuffix) {
		t.Fatalf("got %q, want %q<dlerror>%q", msg, wantPrefix, wantSuffix)
	}
	if inner := strings.TrimSuffix(strings.TrimPrefix(msg, wantPrefix), wantSuffix); !strings.Contains(inner, "No such file") {
		t.Errorf("dlerror text %q does not say the file is missing", inner)
	}
}

func TestOpenHonorsOptionsLibrary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libascendcl-from-config.so")
	_, err := device.Open(device.KindACL, 0, device.Options{Backend: Config{Library: path}})
	if err == nil || !strings.Contains(err.Error(), "acl: dlopen "+path+": ") {
		t.Fatalf("device.Open with ACL.Library=%s: got %v, want a dlopen error naming it", path, err)
	}
}

func TestOpenLibraryMissingSymbols(t *testing.T) {
	so := buildSO(t, "libascendcl.so", `
int aclInit(const char *c) { (void)c; return 0; }
const char *aclGetRecentErrMsg(void) { return 0; }
int aclrtMemcpyBatchAsync(void) { return 0; }
`)
	_, err := OpenLibrary(so)
	if err == nil {
		t.Fatal("OpenLibrary of a library with three symbols succeeded")
	}
	msg := err.Error()
	prefix, suffix := "acl: "+so+": missing ", "; CANN too old, or not libascendcl?"
	if !strings.HasPrefix(msg, prefix) || !strings.HasSuffix(msg, suffix) {
		t.Fatalf("got %q, want %q...%q", msg, prefix, suffix)
	}
	listed := strings.Split(strings.TrimSuffix(strings.TrimPrefix(msg, prefix), suffix), ", ")
	var want []string
	for _, s := range symbols() {
		if s.Group == 0 && s.Name != "aclInit" && s.Name != "aclGetRecentErrMsg" {
			want = append(want, s.Name)
		}
	}
	if !slices.Equal(listed, want) {
		t.Errorf("missing list:\n got %v\nwant %v", listed, want)
	}
	for _, s := range listed {
		if s == "aclrtMemcpyBatchAsync" || strings.HasPrefix(s, "aclrtIpcMem") || s == "aclrtCreateStreamWithConfig" {
			t.Errorf("optional %s listed as missing", s)
		}
	}
}

func TestSymbolTable(t *testing.T) {
	groups := map[string]int{}
	for _, s := range symbols() {
		if _, dup := groups[s.Name]; dup {
			t.Errorf("symbol %s bound twice", s.Name)
		}
		groups[s.Name] = s.Group
	}
	// aclrtQueryEvent reports aclrtEventStatus (COMPLETE 0, NOT_READY 1),
	// the inverse of aclrtQueryEventStatus: it must never be bound.
	if _, ok := groups["aclrtQueryEvent"]; ok {
		t.Error("aclrtQueryEvent is bound; use aclrtQueryEventStatus")
	}
	for name, want := range map[string]int{
		"aclrtQueryEventStatus":             0,
		"aclrtCreateEventWithFlag":          0,
		"aclrtSynchronizeStreamWithTimeout": 0,
		"aclrtHostRegister":                 0,
		"aclrtMemcpyBatchAsync":             1,
		"aclrtIpcMemGetExportKey":           2,
		"aclrtIpcMemSetImportPid":           2,
		"aclrtIpcMemImportByKey":            2,
		"aclrtIpcMemClose":                  2,
		"aclrtCreateStreamWithConfig":       3,
	} {
		if g, ok := groups[name]; !ok || g != want {
			t.Errorf("%s: group %d (bound %v), want %d", name, g, ok, want)
		}
	}
	for _, never := range []string{"aclFinalize", "aclrtSynchronizeStream", "aclrtSynchronizeEvent"} {
		if _, ok := groups[never]; ok {
			t.Errorf("%s is bound; stage does not call it", never)
		}
	}
}

func TestError(t *testing.T) {
	e := &Error{Op: "aclrtMalloc(1073741824 B, HUGE_FIRST)", Code: 207001, Name: codeName(207001), Msg: "EL0004: Failed to allocate memory."}
	want := "acl: aclrtMalloc(1073741824 B, HUGE_FIRST): ACL_ERROR_RT_MEMORY_ALLOCATION: EL0004: Failed to allocate memory."
	if e.Error() != want {
		t.Errorf("got %q, want %q", e.Error(), want)
	}
	if got := (&Error{Op: "aclInit(NULL)", Code: 123456, Name: codeName(123456)}).Error(); got != "acl: aclInit(NULL): aclError(123456)" {
		t.Errorf("unknown code, no message: got %q", got)
	}
	tests := []struct {
		code                     int
		oom, notSupported, ready bool
	}{
		{207001, true, false, false},
		{207018, true, false, false},
		{200000, true, false, false},
		{207000, false, true, false},
		{200001, false, true, false},
		{200006, false, true, false},
		{507046, false, false, true},
		{507047, false, false, true},
		{507013, false, false, false},
		{100000, false, false, false},
	}
	for _, tc := range tests {
		wrapped := errors.Join(errors.New("context"), &Error{Op: "x", Code: tc.code})
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
}

func TestChooseCopyMode(t *testing.T) {
	noBatch := errors.New("no batch")
	tests := []struct {
		want     CopyMode
		batchErr error
		got      CopyMode
		whyHas   string
		fails    bool
	}{
		{CopyAuto, nil, CopyBatch, "batch (auto)", false},
		{CopyAuto, noBatch, CopyPack, "pack (auto; batch unavailable: no batch)", false},
		{CopyBatch, nil, CopyBatch, "requested", false},
		{CopyBatch, noBatch, "", "", true},
		{CopyPack, nil, CopyPack, "requested", false},
		{CopyPerCopy, noBatch, CopyPerCopy, "requested", false},
		{"kernel", nil, "", "", true},
	}
	for _, tc := range tests {
		got, why, err := chooseCopyMode(tc.want, tc.batchErr)
		if tc.fails {
			if err == nil {
				t.Errorf("want %q (batch %v): got %q, want an error", tc.want, tc.batchErr, got)
			} else if tc.want == CopyBatch && !errors.Is(err, device.ErrNotSupported) {
				t.Errorf("want batch: error %v does not wrap ErrNotSupported", err)
			}
			continue
		}
		if err != nil || got != tc.got || !strings.Contains(why, tc.whyHas) {
			t.Errorf("want %q (batch %v): got (%q, %q, %v), want (%q, ...%s..., nil)", tc.want, tc.batchErr, got, why, err, tc.got, tc.whyHas)
		}
	}
}

func TestParseCopyMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want CopyMode
		bad  bool
	}{
		{"", CopyAuto, false},
		{"auto", CopyAuto, false},
		{"batch", CopyBatch, false},
		{"pack", CopyPack, false},
		{"percopy", CopyPerCopy, false},
		{"kernel", "", true},
	} {
		got, err := ParseCopyMode(tc.in)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), `copy mode "kernel"`) {
				t.Errorf("%q: got (%q, %v), want an error naming it", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got (%q, %v), want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestCoalesce(t *testing.T) {
	segs := []device.Seg{
		{Addr: 0x1000, Len: 0x100},
		{Addr: 0x1100, Len: 0x10}, // continues the first
		{Addr: 0x5000, Len: 0},    // empty: skipped, and does not break a run
		{Addr: 0x1110, Len: 0x20}, // continues again
		{Addr: 0x1000, Len: 8},    // goes back: a new range
		{Addr: 0x9000, Len: 1},
	}
	dev, lens := make([]uint64, len(segs)), make([]uint64, len(segs))
	n := coalesce(dev, lens, segs)
	wantDev := []uint64{0x1000, 0x1000, 0x9000}
	wantLen := []uint64{0x130, 8, 1}
	if n != 3 || !slices.Equal(dev[:n], wantDev) || !slices.Equal(lens[:n], wantLen) {
		t.Fatalf("coalesce = %d %x %x, want 3 %x %x", n, dev[:n], lens[:n], wantDev, wantLen)
	}
}

func TestCheckKey(t *testing.T) {
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"fakeacl:1:2:0:100", true},
		{strings.Repeat("k", 64), true},
		{strings.Repeat("k", 65), false},
		{"", false},
		{"key\x00tail", false},
		{"key\n", false},
	} {
		if err := checkKey(tc.key); (err == nil) != tc.ok {
			t.Errorf("checkKey(%q) = %v, want ok %v", tc.key, err, tc.ok)
		}
	}
}
