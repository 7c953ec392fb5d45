package config

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/acl"
	"github.com/stage-kv/stage/cuda"
	"github.com/stage-kv/stage/device/hostmem"
	"github.com/stage-kv/stage/hip"
)

// Options hands the backend device.kind names its own settings type, each
// key carried to its field, and nothing for a kind no backend has.
func TestDeviceOptions(t *testing.T) {
	d := Device{
		Hostmem: Hostmem{BandwidthGBps: 2.5, Latency: 3 * time.Microsecond},
		CUDA:    DeviceCUDA{Library: "/x/libcuda.so", CopyMode: "batch", EventWait: "spin", PTX: "/x/k.ptx"},
		ACL:     DeviceACL{Library: "/x/libascendcl.so", CopyMode: "pack"},
		HIP:     DeviceHIP{Library: "/opt/rocm/lib/libamdhip64.so"},
	}
	tests := []struct {
		kind string
		want any
	}{
		{"hostmem", hostmem.Config{BandwidthBytesPerSec: 2.5e9, Latency: 3 * time.Microsecond}},
		{"cuda", cuda.Config{Library: "/x/libcuda.so", CopyMode: cuda.CopyBatch, EventWait: cuda.WaitSpin, PTXFile: "/x/k.ptx"}},
		{"acl", acl.Config{Library: "/x/libascendcl.so", CopyMode: acl.CopyPack}},
		{"hip", hip.Config{Library: "/opt/rocm/lib/libamdhip64.so"}},
		{"tpu", nil},
	}
	for _, tc := range tests {
		t.Run(tc.kind, func(t *testing.T) {
			d.Kind = tc.kind
			if got := d.Options().Backend; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v, want %#v", got, tc.want)
			}
		})
	}
}

// The values config accepts for the backends' keys are the ones the
// backends parse.
func TestDeviceValuesParse(t *testing.T) {
	check := func(key string, values []string, parse func(string) error) {
		for _, v := range values {
			if err := parse(v); err != nil {
				t.Errorf("config allows %s %q, the backend refuses it: %v", key, v, err)
			}
		}
	}
	check("device.cuda.copy_mode", CUDACopyModes, func(v string) error { _, err := cuda.ParseCopyMode(v); return err })
	check("device.cuda.event_wait", CUDAEventWaits, func(v string) error { _, err := cuda.ParseEventWait(v); return err })
	check("device.acl.copy_mode", ACLCopyModes, func(v string) error { _, err := acl.ParseCopyMode(v); return err })
}

// Load reads the test fault switches once and hands them down: the node's
// in Knobs, hostmem's in the device options; a bad value stops the load
// naming the switch.
func TestLoadReadsKnobs(t *testing.T) {
	tests := []struct {
		name      string
		failAfter string // STAGE_TEST_HOSTMEM_FAIL_AFTER
		ipc       string // STAGE_TEST_FAULT_IPC_IMPORT
		wantHost  hostmem.Config
		wantIPC   bool
		wantErr   string
	}{
		{"none", "", "", hostmem.Config{}, false, ""},
		{"both", "4", "1", hostmem.Config{Fail: true, FailAfter: 4}, true, ""},
		{"bad fail after", "-2", "", hostmem.Config{}, false, `test fault switch STAGE_TEST_HOSTMEM_FAIL_AFTER="-2": want an integer >= 0`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv("STAGE_SECURITY_TOKEN", "t0ken")
			t.Setenv("STAGE_TEST_HOSTMEM_FAIL_AFTER", tc.failAfter)
			t.Setenv("STAGE_TEST_FAULT_IPC_IMPORT", tc.ipc)
			c, err := Load("", nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error holding %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Device.Options().Backend; got != tc.wantHost {
				t.Errorf("device options: got %#v, want %#v", got, tc.wantHost)
			}
			if c.Knobs.FaultIPCImport != tc.wantIPC {
				t.Errorf("Knobs.FaultIPCImport: got %v, want %v", c.Knobs.FaultIPCImport, tc.wantIPC)
			}
		})
	}
}
