package proxy

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/engine"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/wire"
)

// oomDevice is a device whose imports fail the way a vendor backend's do
// when the device is full: its own words, device.ErrOutOfMemory wrapped.
type oomDevice struct{ device.Device }

func (oomDevice) Ordinal() int   { return 0 }
func (oomDevice) String() string { return "oom:0" }
func (oomDevice) Import(device.Handle) (device.Mapping, error) {
	return nil, fmt.Errorf("cuIpcOpenMemHandle: %w", device.ErrOutOfMemory)
}

// TestErrorsIsThroughLayers follows a device error from the backend to
// the answer an engine gets: every layer adds what it was doing, and the
// cause stays reachable with errors.Is while the code stays the one the
// layer that knew best gave it.
func TestErrorsIsThroughLayers(t *testing.T) {
	dev := oomDevice{}
	s := &Server{dev: dev, regions: region.NewTable(dev, nil)}
	reg := &wire.Register{Name: "kv", Access: wire.AccessLocalRead, Handle: uint8(device.HandleCUDAIPC),
		HandleRaw: []byte{1, 2, 3}, AllocSize: 4096, Length: 4096}
	registerErr := engineHost{s}.Register(engine.Owner{Conn: 1, Group: "c:1"}, reg, -1)
	for _, tc := range []struct {
		layer string
		err   error
		code  wire.Code
	}{
		{"region table", s.regions.Register(region.Owner{}, "kv2", device.Handle{Kind: device.HandleCUDAIPC, Bytes: []byte{4}, FD: -1, Size: 64}, wire.AccessLocalRead, 0, 64), wire.CodeDevice},
		{"control socket's Register", registerErr, wire.CodeDevice},
		{"an op of a transfer", codeErr(errCode(registerErr), "op %d: %w", 3, registerErr), wire.CodeDevice},
		{"the sender core's verdict", coreErr(fmt.Errorf("chunk 2: %w", registerErr)), wire.CodeDevice},
		{"a session's end", codeErr(wire.CodePeerUnavailable, "session with %s closed: %w", "b", registerErr), wire.CodePeerUnavailable},
	} {
		if tc.err == nil {
			t.Fatalf("%s: no error", tc.layer)
		}
		if !errors.Is(tc.err, device.ErrOutOfMemory) {
			t.Errorf("%s: errors.Is(%q, device.ErrOutOfMemory) is false", tc.layer, tc.err)
		}
		if got := errCode(tc.err); got != tc.code {
			t.Errorf("%s: code %v, want %v", tc.layer, got, tc.code)
		}
	}
}
