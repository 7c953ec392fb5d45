package proxytest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// TestWaitIdle: a region left registered keeps a sidecar from idle, and
// the error says which figure; once it is gone the sidecar is idle.
func TestWaitIdle(t *testing.T) {
	s := Start(t, "solo", "", Options{})
	base := s.Snapshot()
	c, err := kvsim.New("left", 1, 64<<10, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Register(context.Background(), s.Client, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	if err := s.waitIdle(base, 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "regions 1 (was 0)") {
		t.Fatalf("with a region left registered: got %v, want not idle naming the regions", err)
	}
	if err := c.Unregister(context.Background(), s.Client); err != nil {
		t.Fatal(err)
	}
	if err := s.waitIdle(base, time.Second); err != nil {
		t.Fatal(err)
	}
}
