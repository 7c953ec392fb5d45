package config

import (
	"reflect"
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
