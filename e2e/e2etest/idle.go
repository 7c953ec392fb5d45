package e2etest

import (
	"context"
	"fmt"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/wire"
)

// Settle waits (up to timeout) until the sidecar behind cl has at least
// sessions peer sessions, lets their goroutines start, and returns its
// figures then: the baseline CheckIdle compares with.
func Settle(ctx context.Context, cl *client.Client, sessions int, timeout time.Duration) (wire.Stats, error) {
	deadline := time.Now().Add(timeout)
	for {
		st, err := cl.Stats(ctx)
		if err != nil {
			return wire.Stats{}, fmt.Errorf("stats: %w", err)
		}
		if st.Sessions >= sessions {
			time.Sleep(100 * time.Millisecond) // let session goroutines start
			if st, err = cl.Stats(ctx); err != nil {
				return wire.Stats{}, fmt.Errorf("stats: %w", err)
			}
			return *st, nil
		}
		if time.Now().After(deadline) {
			return *st, fmt.Errorf("%d sessions after %v, want %d", st.Sessions, timeout, sessions)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CheckIdle waits (up to timeout) until the sidecar behind cl is back to
// base: no slot in use, no transfer active, no peer mapping, regions and
// mappings as then (the test unregistered its own), goroutines and fds no
// more than then. The error lists every figure against its baseline.
func CheckIdle(ctx context.Context, cl *client.Client, base wire.Stats, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		st, err := cl.Stats(ctx)
		if err != nil {
			return fmt.Errorf("stats: %w", err)
		}
		if idle(st, &base) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not idle after %v: send slots %d, recv slots %d, transfers %d, regions %d (was %d), mappings %d (was %d), peer mappings %d, goroutines %d (was %d), fds %d (was %d)",
				timeout, st.SendInUse, st.RecvInUse, st.Transfers, st.Regions, base.Regions, st.Mappings, base.Mappings, st.PeerMappings,
				st.Goroutines, base.Goroutines, st.FDs, base.FDs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func idle(st, base *wire.Stats) bool {
	return st.SendInUse == 0 && st.RecvInUse == 0 && st.Transfers == 0 && st.PeerMappings == 0 && st.Regions == base.Regions &&
		st.Mappings == base.Mappings && st.Goroutines <= base.Goroutines && st.FDs <= base.FDs
}
