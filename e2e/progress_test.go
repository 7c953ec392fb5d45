package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// TestProgressMoves (issue 16 item 4): XferStatus.Done of a running push
// (bytes acked) and of a running pull (bytes landed) grows while the
// transfer runs, never shrinks, and equals Total at the end. The emulated
// device copies at 50 MB/s, so 48 MiB take about a second on each side.
func TestProgressMoves(t *testing.T) {
	const size = 48 << 20
	slow := "device:\n  hostmem:\n    bandwidth_gbps: 0.05\n"
	for _, dir := range []wire.Direction{wire.Push, wire.Pull} {
		t.Run(dir.String(), func(t *testing.T) {
			pre, dec := pair(t, nodeOpts{stripes: 2, slots: 16, extra: slow, decExtra: slow})
			var S, D *kvsim.Cache
			if dir == wire.Push {
				S, D = caches(t, pre, dec, 1, size)
			} else {
				S, D = caches(t, dec, pre, 1, size)
			}
			ms := kvsim.Ranges(S, 1<<20)
			ctx := context.Background()
			local, remote := S, D
			if dir == wire.Pull {
				local, remote = D, S
			}
			id, err := pre.cl.Submit(ctx, kvsim.Transfer("decode", dir, "progress", local, remote, ms))
			if err != nil {
				t.Fatal(err)
			}
			var last, mid uint64
			var polls int
			deadline := time.Now().Add(60 * time.Second)
			for {
				st, err := pre.cl.Status(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				polls++
				if st.Total != size {
					t.Fatalf("Total %d, want %d", st.Total, size)
				}
				if st.Done < last {
					t.Fatalf("Done went back from %d to %d", last, st.Done)
				}
				last = st.Done
				if st.State == wire.StateFailed {
					t.Fatalf("transfer failed: %s %s", st.Code, st.Message)
				}
				if st.State == wire.StateDone {
					if st.Done != st.Total {
						t.Fatalf("done with Done %d of %d", st.Done, st.Total)
					}
					break
				}
				if st.Done > 0 && st.Done < st.Total && mid == 0 {
					mid = st.Done
				}
				if time.Now().After(deadline) {
					t.Fatalf("not done after 60s (Done %d of %d)", st.Done, st.Total)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if mid == 0 {
				t.Fatalf("in %d polls of a running %s, Done was never between 0 and Total", polls, dir)
			}
			t.Logf("%s: Done %d of %d seen mid-flight, %d polls", dir, mid, uint64(size), polls)
			if err := kvsim.Verify(S, D, ms, guard); err != nil {
				t.Fatal(err)
			}
		})
	}
}
