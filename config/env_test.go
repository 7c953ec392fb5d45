package config

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func TestUnknownEnvVars(t *testing.T) {
	cases := []struct {
		name    string
		environ []string
		want    []string // UnknownEnv.String()
	}{
		{"none", []string{"HOME=/root", "PATH=/bin"}, nil},
		{"config keys", []string{"STAGE_STAGING_SLOTS=8", "STAGE_DEVICE_CUDA_COPY_MODE=batch", "STAGE_SECURITY_TOKEN=x", "STAGE_CONTROL_SOCKET=/s"}, nil},
		{"test switches", []string{"STAGE_TEST_HOSTMEM_FAIL_AFTER=3", "STAGE_TEST_ANYTHING=1"}, nil},
		{"typo", []string{"STAGE_STAGING_SLOT=8"}, []string{"STAGE_STAGING_SLOT"}},
		{"renamed", []string{"STAGE_CUDA_COPY=batch", "STAGE_ACL_LIBRARY=/x.so"}, []string{
			"STAGE_ACL_LIBRARY (renamed: use STAGE_DEVICE_ACL_LIBRARY (device.acl.library))",
			"STAGE_CUDA_COPY (renamed: use STAGE_DEVICE_CUDA_COPY_MODE (device.cuda.copy_mode))"}},
		{"prefix only", []string{"STAGE_=1", "STAGEX=1", "XSTAGE_Y=1"}, []string{"STAGE_"}},
		{"no value", []string{"STAGE_NOPE"}, []string{"STAGE_NOPE"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, u := range UnknownEnvVars(tc.environ) {
				got = append(got, u.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// Every renamed variable points at a key that exists, and is itself no
// longer a key.
func TestRenamedEnvTargets(t *testing.T) {
	known := map[string]bool{}
	for _, k := range LeafKeys() {
		known[EnvName(k)] = true
	}
	for old, hint := range renamedEnv {
		if known[old] {
			t.Errorf("%s is renamed but still sets a key", old)
		}
		target, _, _ := strings.Cut(hint, " ")
		if !known[target] && !strings.HasPrefix(target, TestEnvPrefix) {
			t.Errorf("%s: renamed to %s, which sets no key and is no test switch", old, target)
		}
	}
}

// The backend keys come from the env, are validated, and show in the
// default configuration.
func TestDeviceBackendKeys(t *testing.T) {
	for _, k := range []string{"device.cuda.library", "device.cuda.copy_mode", "device.cuda.event_wait", "device.cuda.ptx", "device.acl.library", "device.acl.copy_mode", "device.hip.library"} {
		if !slices.Contains(LeafKeys(), k) {
			t.Errorf("%s is not a key", k)
		}
		last := k[strings.LastIndex(k, ".")+1:]
		if !bytes.Contains(DefaultYAML(), []byte("    "+last+":")) {
			t.Errorf("default.yaml lacks %s", k)
		}
	}
	d := Default().Device
	if d.CUDA.Library != "libcuda.so.1" || d.CUDA.CopyMode != "auto" || d.CUDA.EventWait != "auto" || d.CUDA.PTX != "" ||
		d.ACL.Library != "libascendcl.so" || d.ACL.CopyMode != "auto" || d.HIP.Library != "libamdhip64.so" {
		t.Errorf("defaults: %+v", d)
	}

	ptx := writeFile(t, "// ptx")
	cases := []struct {
		name    string
		env     map[string]string
		badKeys []string
	}{
		{"all set", map[string]string{"STAGE_DEVICE_CUDA_LIBRARY": "/opt/libcuda.so.1", "STAGE_DEVICE_CUDA_COPY_MODE": "percopy",
			"STAGE_DEVICE_CUDA_EVENT_WAIT": "spin", "STAGE_DEVICE_CUDA_PTX": ptx, "STAGE_DEVICE_ACL_COPY_MODE": "pack",
			"STAGE_DEVICE_HIP_LIBRARY": "/opt/rocm/lib/libamdhip64.so"}, nil},
		{"bad modes", map[string]string{"STAGE_DEVICE_CUDA_COPY_MODE": "pack", "STAGE_DEVICE_ACL_COPY_MODE": "kernel", "STAGE_DEVICE_CUDA_EVENT_WAIT": "busy"},
			[]string{"device.cuda.copy_mode", "device.acl.copy_mode", "device.cuda.event_wait"}},
		{"missing ptx", map[string]string{"STAGE_DEVICE_CUDA_PTX": ptx + ".gone"}, []string{"device.cuda.ptx"}},
		{"ptx is a directory", map[string]string{"STAGE_DEVICE_CUDA_PTX": t.TempDir()}, []string{"device.cuda.ptx"}},
		{"padded library", map[string]string{"STAGE_DEVICE_ACL_LIBRARY": " libascendcl.so"}, []string{"device.acl.library"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv("STAGE_SECURITY_ALLOW_INSECURE", "true")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			c, err := Load("", nil)
			if len(tc.badKeys) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if c.Device.CUDA.CopyMode != "percopy" || c.Device.CUDA.PTX != ptx || c.Device.ACL.CopyMode != "pack" || c.Device.HIP.Library != "/opt/rocm/lib/libamdhip64.so" {
					t.Errorf("env not applied: %+v", c.Device)
				}
				return
			}
			ve, ok := err.(*ValidationError)
			if !ok {
				t.Fatalf("got %v, want a *ValidationError", err)
			}
			for _, k := range tc.badKeys {
				if !ve.Has(k) {
					t.Errorf("no problem for %s in:\n%v", k, ve)
				}
			}
			if len(ve.Problems) != len(tc.badKeys) {
				t.Errorf("got %d problems, want %d:\n%v", len(ve.Problems), len(tc.badKeys), ve)
			}
		})
	}
}
