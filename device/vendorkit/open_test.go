package vendorkit

import (
	"errors"
	"testing"

	"github.com/stage-kv/stage/device"
)

type mode string

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want mode
		err  string
	}{
		{"", "", ""},
		{"auto", "", ""},
		{"batch", "batch", ""},
		{"pack", "pack", ""},
		{"kernel", "", `acl: copy mode "kernel": want batch, pack, percopy or auto`},
		{"Batch", "", `acl: copy mode "Batch": want batch, pack, percopy or auto`},
	} {
		got, err := ParseMode[mode]("acl", tc.in, "batch", "pack", "percopy")
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("ParseMode(%q): %q, %v; want %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseMode(%q): %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestCodes(t *testing.T) {
	codes := Codes{
		{Err: device.ErrOutOfMemory, Codes: []int{2, 207001}},
		{Err: device.ErrNotReady, Codes: []int{600}},
	}
	other := errors.New("other")
	for _, tc := range []struct {
		code   int
		target error
		want   bool
	}{
		{2, device.ErrOutOfMemory, true},
		{207001, device.ErrOutOfMemory, true},
		{600, device.ErrOutOfMemory, false},
		{600, device.ErrNotReady, true},
		{2, device.ErrNotSupported, false},
		{2, other, false},
		{0, nil, false},
	} {
		if got := codes.Is(tc.code, tc.target); got != tc.want {
			t.Errorf("Is(%d, %v) = %v, want %v", tc.code, tc.target, got, tc.want)
		}
	}
}

func TestOpenShared(t *testing.T) {
	type lib struct{ name string }
	type cfg struct{ lib string }
	libs := map[string]*lib{"": {"default"}, "other.so": {"other.so"}}
	shared := func(name string) (*lib, error) {
		if l := libs[name]; l != nil {
			return l, nil
		}
		return nil, errors.New("no such library: " + name)
	}
	open := func(l *lib, ordinal int, c cfg) (string, error) { return l.name + "/" + string(rune('0'+ordinal)), nil }
	if d, err := OpenShared(2, cfg{}, "", shared, open); err != nil || d != "default/2" {
		t.Errorf("OpenShared default: %q, %v", d, err)
	}
	if d, err := OpenShared(1, cfg{lib: "other.so"}, "other.so", shared, open); err != nil || d != "other.so/1" {
		t.Errorf("OpenShared other.so: %q, %v", d, err)
	}
	if d, err := OpenShared(0, cfg{}, "missing.so", shared, open); err == nil || d != "" {
		t.Errorf("OpenShared of a library that does not open: %q, %v", d, err)
	}
}
