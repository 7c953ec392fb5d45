package node

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/hostmem"
)

// A ring this sidecar makes is sealed against resizing, and a ring handed
// over that its maker could still shrink is refused (issue 35, item 1: a
// truncated mapping faults the copies of whoever maps it).
func TestRingSealed(t *testing.T) {
	dv, err := hostmem.Open(0, device.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dv.Close()
	hr := dv.(device.HostRegisterer)
	r, fd, err := newRing(hr, 2, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	defer r.close()
	if err := unix.Ftruncate(fd, 0); !errors.Is(err, unix.EPERM) {
		t.Errorf("ftruncate of a ring this sidecar made: got %v, want EPERM (sealed)", err)
	}
	open, err := unix.MemfdCreate("unsealed-ring", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(open)
	if err := unix.Ftruncate(open, 2*4096); err != nil {
		t.Fatal(err)
	}
	if r2, err := mapRing(hr, open, 2, 4096); err == nil || !strings.Contains(err.Error(), "F_SEAL_SHRINK") {
		if err == nil {
			_ = r2.close()
		}
		t.Fatalf("mapRing of a memfd that can shrink: got %v, want a refusal naming F_SEAL_SHRINK", err)
	}
}
