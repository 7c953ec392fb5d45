package scenarios_test

import (
	"context"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// TestShrinkableMemfdRefused is issue 35's first point as a tenant would
// try it: register a 1 MiB memfd it can still truncate, truncate it, and
// push 128 KiB from it. The sidecar used to die of SIGBUS in the copy
// (and this test process with it); now the registration is refused, saying
// how to seal, the push names no region, and the sidecars go on serving.
func TestShrinkableMemfdRefused(t *testing.T) {
	pre, dec := proxytest.Pair(t, e2eOpts())
	S, D := caches(t, pre, dec, 1, 1<<20)
	ctx := context.Background()
	fd, err := unix.MemfdCreate("tenant", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 1<<20); err != nil {
		t.Fatal(err)
	}
	err = pre.Client.Register(ctx, client.Region{Name: "tenant/0", Handle: 1, Access: wire.AccessAll, AllocSize: 1 << 20, Length: 1 << 20, FD: fd})
	if err == nil || !strings.Contains(err.Error(), "F_SEAL_SHRINK") || !strings.Contains(err.Error(), "F_ADD_SEALS") {
		t.Fatalf("Register of a memfd that can shrink: got %v, want a refusal that says how to seal it", err)
	}
	if err := unix.Ftruncate(fd, 0); err != nil {
		t.Fatal(err)
	}
	tr := kvsim.Transfer(route, wire.Push, "tenant", S, D, kvsim.Ranges(S, 128<<10)[:1])
	tr.LocalNames = []string{"tenant/0"}
	if _, err := pre.Client.Do(ctx, tr); client.CodeOf(err) != wire.CodeUnknownRegion {
		t.Fatalf("push from the refused region: got %v, want unknown region", err)
	}
	run(t, pre.Client, wire.Push, "after", S, D, kvsim.Ranges(S, 128<<10))
}
