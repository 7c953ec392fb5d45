//go:build gpu

package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// run submits one transfer per layer at once and waits for all of them.
func run(t *testing.T, cl *client.Client, dir wire.Direction, tag string, local, remote *kvsim.Cache, ms []kvsim.Move) {
	t.Helper()
	if _, err := kvsim.RunLayers(context.Background(), cl, "decode", dir, tag, local, remote, ms, 60*time.Second); err != nil {
		t.Fatal(err)
	}
}
