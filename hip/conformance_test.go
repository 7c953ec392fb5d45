package hip

import (
	"testing"

	"github.com/stage-kv/stage/device/devicetest"
)

// TestConformance runs the device conformance suite against the emulated
// runtime: every layout byte-exact, events, and concurrent streams from
// fresh OS threads (each must make its device current itself).
func TestConformance(t *testing.T) {
	l := fakeLibrary(t)
	d := openDev(t, l, 0)
	devicetest.Run(t, d, d, devicetest.Options{})
	if n := hook(t, l, "fakehip_sync_copies"); n != 0 {
		t.Errorf("%d copies ran synchronously: the pinned buffers were not used as pinned", n)
	}
}
