package device

import (
	"errors"
	"strings"
	"testing"
)

func TestBackendConfig(t *testing.T) {
	type cfgA struct{ N int }
	type cfgB struct{ S string }
	tests := []struct {
		name    string
		opts    Options
		want    cfgA
		wantErr string
	}{
		{"none: defaults", Options{}, cfgA{}, ""},
		{"its own", Options{Backend: cfgA{N: 3}}, cfgA{N: 3}, ""},
		{"another backend's", Options{Backend: cfgB{S: "x"}}, cfgA{}, "device: backend cuda: settings of type device.cfgB, want device.cfgA"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := BackendConfig[cfgA](tc.opts, KindCUDA)
			if got != tc.want || (err == nil) != (tc.wantErr == "") || (err != nil && err.Error() != tc.wantErr) {
				t.Errorf("got %+v, %v; want %+v, %q", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// fakeDev is a Device of a test backend; only its type matters.
type fakeDev struct {
	Device
	n int
}

func TestOpenAs(t *testing.T) {
	type cfg struct{ N int }
	open := func(ordinal int, c cfg) (*fakeDev, error) {
		if ordinal < 0 {
			return nil, errors.New("bad ordinal")
		}
		return &fakeDev{n: c.N}, nil
	}
	tests := []struct {
		name    string
		ordinal int
		opts    Options
		wantN   int
		wantErr string
	}{
		{"settings carried", 0, Options{Backend: cfg{N: 7}}, 7, ""},
		{"defaults", 0, Options{}, 0, ""},
		{"open fails: nil Device", -1, Options{}, 0, "bad ordinal"},
		{"another backend's settings", 0, Options{Backend: "x"}, 0, "settings of type string"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := OpenAs(KindHostmem, tc.ordinal, tc.opts, open)
			if tc.wantErr != "" {
				if d != nil || err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %#v, %v; want a nil Device and an error holding %q", d, err, tc.wantErr)
				}
				return
			}
			if fd, ok := d.(*fakeDev); err != nil || !ok || fd.n != tc.wantN {
				t.Errorf("got %#v, %v; want a *fakeDev with n %d", d, err, tc.wantN)
			}
		})
	}
}
