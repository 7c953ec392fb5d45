package device_test

import (
	"slices"
	"testing"

	_ "github.com/stage-kv/stage/acl"
	_ "github.com/stage-kv/stage/cuda"
	"github.com/stage-kv/stage/device"
	_ "github.com/stage-kv/stage/device/hostmem"
	_ "github.com/stage-kv/stage/hip"
)

// TestCapabilities holds every backend's declared capabilities against what
// its Device and Stream types implement, and logs the table (go test -v):
// the one place that says which backend has which optional interface.
func TestCapabilities(t *testing.T) {
	want := []device.Kind{device.KindACL, device.KindCUDA, device.KindHIP, device.KindHostmem}
	if got := device.Kinds(); !slices.Equal(got, want) {
		t.Fatalf("registered backends: got %v, want %v", got, want)
	}
	for _, k := range want {
		b, _ := device.Lookup(k)
		if b.Device == nil || b.Stream == nil {
			t.Errorf("%s: Backend.Device or Backend.Stream is nil; register values of the backend's types", k)
			continue
		}
		got := device.Implements(b.Device, b.Stream)
		t.Logf("%-8s %v", k, got)
		if !slices.Equal(got, b.Caps) {
			t.Errorf("%s: declares %v, its types implement %v; fix Backend.Caps in its init", k, b.Caps, got)
		}
	}
}

// TestImplements checks the type assertions themselves on small types
// of known capabilities, so a check that always agrees would fail here.
func TestImplements(t *testing.T) {
	tests := []struct {
		name string
		dev  device.Device
		s    device.Stream
		want []device.Capability
	}{
		{"nothing", nil, nil, nil},
		{"plain", plainDev{}, plainStream{}, nil},
		{"sync and export", syncExportDev{}, nil, []device.Capability{device.CapSyncCopier, device.CapExporter}},
		{"dtod stream", nil, dtodStream{}, []device.Capability{device.CapDtoD}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := device.Implements(tc.dev, tc.s); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

type plainDev struct{ device.Device }

type syncExportDev struct{ device.Device }

func (syncExportDev) GatherSync(device.Pinned, []device.Seg) error  { return nil }
func (syncExportDev) ScatterSync([]device.Seg, device.Pinned) error { return nil }
func (syncExportDev) Export(device.Addr, ...int32) (device.Export, error) {
	return device.Export{}, nil
}

type plainStream struct{ device.Stream }

type dtodStream struct{ device.Stream }

func (dtodStream) CopyDtoD(dst, src device.Addr, n uint64) error { return nil }
