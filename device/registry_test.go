package device

import "testing"

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
