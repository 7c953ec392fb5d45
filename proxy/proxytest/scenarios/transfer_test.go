package scenarios_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// TestMoveGiB moves 1 GiB each way in both shapes, byte-exact, between
// regions that are views at non-zero offsets inside larger allocations.
// Under the race detector 256 MiB: filling and verifying a GiB in the
// test process would take minutes, and 256 MiB still cycle every slot
// many times over.
func TestMoveGiB(t *testing.T) {
	size := uint64(1 << 30)
	if raceBuild {
		size = 256 << 20
	}
	if testing.Short() {
		size = 64 << 20
	}
	const layers = 4
	for _, tc := range shapes {
		t.Run(tc.name, func(t *testing.T) {
			o := e2eOpts()
			o.Stripes = 4
			pre, dec := proxytest.Pair(t, o)
			var S, D *kvsim.Cache
			if tc.dir == wire.Push {
				S, D = caches(t, pre, dec, layers, size/layers)
			} else {
				S, D = caches(t, dec, pre, layers, size/layers)
			}
			ms := tc.moves(S)
			start := time.Now()
			if tc.dir == wire.Push {
				run(t, pre.Client, wire.Push, "t", S, D, ms)
			} else {
				run(t, pre.Client, wire.Pull, "t", D, S, ms)
			}
			el := time.Since(start)
			if err := kvsim.Verify(S, D, ms, guard); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d MiB in %v (%.2f GB/s)", tc.name, size>>20, el.Round(time.Millisecond), float64(size)/el.Seconds()/1e9)
		})
	}
}

// TestNotifyAfterLanded: the receiving engine hears of every push, with the
// sender's tag, and only once every byte of it is in its memory.
func TestNotifyAfterLanded(t *testing.T) {
	o := e2eOpts()
	o.Slots = 8
	pre, dec := proxytest.Pair(t, o)
	S, D := caches(t, pre, dec, 4, 8<<20)
	notes, err := dec.Client.Subscribe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ms := kvsim.Blocks(S, 16<<10, 5)
	byLayer := kvsim.ByLayer(S, ms)
	ctx := context.Background()
	for l, lm := range byLayer {
		if _, err := pre.Client.Submit(ctx, kvsim.Transfer(route, wire.Push, fmt.Sprintf("request-%d", l), S, D, lm)); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	for len(seen) < len(byLayer) {
		select {
		case n := <-notes:
			if n.Code != wire.CodeOK {
				t.Fatalf("notification for %q failed: %s", n.Tag, n.Message)
			}
			var l int
			if _, err := fmt.Sscanf(n.Tag, "request-%d", &l); err != nil {
				t.Fatalf("notification with tag %q", n.Tag)
			}
			// Every byte of this layer must be in place already.
			if err := kvsim.Verify(S, D, byLayer[l], guard); err != nil {
				t.Fatalf("notified of %q before it landed: %v", n.Tag, err)
			}
			if n.Peer != "prefill" || n.Dir != wire.Push || n.Bytes != kvsim.Bytes(byLayer[l]) {
				t.Errorf("notification %+v: want peer prefill, push, %d B", n, kvsim.Bytes(byLayer[l]))
			}
			if seen[n.Tag] {
				t.Errorf("notified twice of %q", n.Tag)
			}
			seen[n.Tag] = true
		case <-time.After(30 * time.Second):
			t.Fatalf("got %d of %d notifications", len(seen), len(byLayer))
		}
	}
}

// TestProgressMoves (issue 16 item 4): XferStatus.Done of a running push
// (bytes acked) and of a running pull (bytes landed) grows while the
// transfer runs, never shrinks, and equals Total at the end. The emulated
// device copies at 50 MB/s, so 48 MiB take about a second on each side.
func TestProgressMoves(t *testing.T) {
	const size = 48 << 20
	for _, dir := range []wire.Direction{wire.Push, wire.Pull} {
		t.Run(dir.String(), func(t *testing.T) {
			o := e2eOpts()
			o.Configure = slowDevice(0.05)
			pre, dec := proxytest.Pair(t, o)
			var S, D *kvsim.Cache
			if dir == wire.Push {
				S, D = caches(t, pre, dec, 1, size)
			} else {
				S, D = caches(t, dec, pre, 1, size)
			}
			ms := kvsim.Ranges(S, 1<<20)
			local, remote := S, D
			if dir == wire.Pull {
				local, remote = D, S
			}
			id, err := pre.Client.Submit(context.Background(), kvsim.Transfer(route, dir, "progress", local, remote, ms))
			if err != nil {
				t.Fatal(err)
			}
			mid, polls := pollProgress(t, pre.Client, id, size)
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

// pollProgress polls transfer id until done, failing if Total is not size,
// Done ever shrinks or ends short of Total; it returns the first Done seen
// strictly between 0 and Total (0 if none) and the number of polls.
func pollProgress(t *testing.T, cl *client.Client, id, size uint64) (mid uint64, polls int) {
	t.Helper()
	var last uint64
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := cl.Status(context.Background(), id)
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
		switch {
		case st.State == wire.StateFailed:
			t.Fatalf("transfer failed: %s %s", st.Code, st.Message)
		case st.State == wire.StateDone:
			if st.Done != st.Total {
				t.Fatalf("done with Done %d of %d", st.Done, st.Total)
			}
			return mid, polls
		case st.Done > 0 && st.Done < st.Total && mid == 0:
			mid = st.Done
		}
		if time.Now().After(deadline) {
			t.Fatalf("not done after 60s (Done %d of %d)", st.Done, st.Total)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCancel: an engine cancels a slow push; the sender reports it
// cancelled, the receiver's subscriber hears it failed, nothing leaks.
func TestCancel(t *testing.T) {
	// The receiver's emulated device copies at 20 MB/s: 16 MiB takes ~1s.
	o := e2eOpts()
	o.Slots, o.Configure = 8, slowDevice(0.02, "decode")
	pre, dec := proxytest.Pair(t, o)
	S, D := caches(t, pre, dec, 1, 16<<20)
	notes, err := dec.Client.Subscribe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id, err := pre.Client.Submit(ctx, kvsim.Transfer(route, wire.Push, "to-cancel", S, D, kvsim.Ranges(S, 1<<20)))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := pre.Client.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	st, err := pre.Client.Wait(ctx, id, 10*time.Second)
	if client.CodeOf(err) != wire.CodeCancelled || st.State != wire.StateFailed {
		t.Fatalf("after cancel: got %v (%+v), want cancelled", err, st)
	}
	select {
	case n := <-notes:
		if n.Tag != "to-cancel" || n.Code != wire.CodeCancelled {
			t.Fatalf("receiver heard %+v, want to-cancel cancelled", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("receiver never heard of the cancelled transfer")
	}
	if err := pre.Client.Cancel(ctx, 123456789); client.CodeOf(err) != wire.CodeUnknownTransfer {
		t.Fatalf("cancel of an unknown transfer: got %v", err)
	}
}

// TestPushShapeLogged: at debug level the sending sidecar logs where each
// TCP push's time went (staging.Shape): streams, ramp, tail, drain, total.
func TestPushShapeLogged(t *testing.T) {
	o := e2eOpts()
	pre, dec := proxytest.Pair(t, o)
	S, D := caches(t, pre, dec, 1, 8<<20)
	ms := kvsim.Ranges(S, 1<<20)
	run(t, pre.Client, wire.Push, "shape", S, D, ms)
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
	lines := pre.Logs.FilterMessage("tcp push").All()
	if len(lines) != 1 {
		t.Fatalf("%d \"tcp push\" lines, want 1 for one push", len(lines))
	}
	f := lines[0].ContextMap()
	if f["bytes"] != uint64(8<<20) || f["peer"] != "decode" {
		t.Errorf("tcp push line %v: want 8 MiB to decode", f)
	}
	total, ok := f["total"].(time.Duration)
	if !ok || total <= 0 {
		t.Fatalf("tcp push line %v: want a total above zero", f)
	}
	for _, k := range []string{"gathered", "ramp", "tail", "drain"} {
		d, ok := f[k].(time.Duration)
		if !ok || d < 0 || d > total {
			t.Errorf("tcp push line: %s = %v, want 0..total (%v)", k, f[k], total)
		}
	}
	if n, _ := f["streams"].(int64); n < 1 || n > int64(pre.Config.Routes[0].Stripes) {
		t.Errorf("tcp push line: streams %v, want 1..%d", f["streams"], pre.Config.Routes[0].Stripes)
	}
	if len(dec.Logs.FilterMessage("tcp push").All()) != 0 {
		t.Error("the receiving sidecar logged a tcp push line; only the sender does")
	}
}
