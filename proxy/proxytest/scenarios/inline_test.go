package scenarios_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// inlineCount is how many pushes a sender has sent on the latency path.
func inlineCount(sc *proxytest.Sidecar) uint64 {
	var sum uint64
	for _, l := range sc.Snapshot().Links {
		sum += l.XfersInline
	}
	return sum
}

// TestInlinePushes: small pushes take the latency path and land byte-exact:
// one range, scattered blocks of several layers, with and without CRC32C,
// and into a receiver whose own latency path is off (it lands them in a
// receive slot). Subscribers hear of each, and a larger push still takes
// the pipeline.
func TestInlinePushes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		decPathOff bool // the receiver's staging.inline_max is 0
		check      uint8
		blocks     bool
		total      uint64
		inlined    bool
	}{
		{"4KiB range", false, wire.ChecksumRoute, false, 4 << 10, true},
		{"scattered 16 x 4KiB with CRC", false, wire.ChecksumOn, true, 64 << 10, true},
		{"receiver path off", true, wire.ChecksumRoute, true, 32 << 10, true},
		{"above inline_max", false, wire.ChecksumRoute, false, 256 << 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := e2eOpts()
			o.Slots = 8
			if tc.decPathOff {
				o.Configure = func(name string, c *config.Config) {
					if name == "decode" {
						c.Staging.InlineMax = 0
					}
				}
			}
			pre, dec := proxytest.Pair(t, o)
			S, D := caches(t, pre, dec, 2, 1<<20)
			notes, err := dec.Client.Subscribe(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var ms []kvsim.Move
			if tc.blocks {
				for _, m := range kvsim.Blocks(S, 4<<10, 11) {
					if kvsim.Bytes(ms) < tc.total {
						ms = append(ms, m)
					}
				}
			} else {
				ms = []kvsim.Move{{Layer: 1, SrcOff: 12345, DstOff: 777777, Len: tc.total}}
			}
			before := inlineCount(pre)
			const n = 20
			for i := 0; i < n; i++ {
				tr := kvsim.Transfer(route, wire.Push, fmt.Sprintf("small-%d", i), S, D, ms)
				tr.Checksum = tc.check
				pushAndHear(t, pre.Client, notes, tr, S, D, ms)
			}
			got := inlineCount(pre) - before
			want := uint64(0)
			if tc.inlined {
				want = n
			}
			if got != want {
				t.Errorf("%d of %d pushes took the latency path, want %d", got, n, want)
			}
		})
	}
}

// pushAndHear runs push tr of ms from S to D and checks it landed
// byte-exact and the receiver's subscriber heard of it.
func pushAndHear(t *testing.T, cl *client.Client, notes <-chan *wire.Notify, tr client.Transfer, S, D *kvsim.Cache, ms []kvsim.Move) {
	t.Helper()
	st, err := cl.Do(context.Background(), tr)
	if err != nil {
		t.Fatalf("push %s: %v", tr.Tag, err)
	}
	if st.State != wire.StateDone || st.Done != kvsim.Bytes(ms) {
		t.Fatalf("push %s: state %s, %d of %d B", tr.Tag, st.State, st.Done, kvsim.Bytes(ms))
	}
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatalf("push %s: %v", tr.Tag, err)
	}
	select {
	case note := <-notes:
		if note.Code != wire.CodeOK || note.Tag != tr.Tag || note.Bytes != kvsim.Bytes(ms) {
			t.Fatalf("push %s: notification %+v", tr.Tag, note)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("push %s: no notification", tr.Tag)
	}
}

// TestInlineRefused: a small push the receiver must refuse fails with the
// receiver's reason and writes nothing, and the path keeps working.
func TestInlineRefused(t *testing.T) {
	o := e2eOpts()
	o.Slots = 8
	pre, dec := proxytest.Pair(t, o)
	S, D := caches(t, pre, dec, 2, 1<<20)
	good := func() client.Transfer {
		return kvsim.Transfer(route, wire.Push, "small", S, D, []kvsim.Move{{Layer: 0, SrcOff: 0, DstOff: 4096, Len: 8192}})
	}
	for _, tc := range []struct {
		name   string
		mutate func(*client.Transfer)
		code   wire.Code
	}{
		{"remote past the end", func(t *client.Transfer) { t.Ops[0].RemoteOff = (1 << 20) - 100 }, wire.CodeOutOfRange},
		{"unknown remote region", func(t *client.Transfer) { t.RemoteNames = []string{"nope/0", "nope/1"} }, wire.CodeUnknownRegion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := good()
			tc.mutate(&tr)
			_, err := pre.Client.Do(context.Background(), tr)
			if got := client.CodeOf(err); got != tc.code {
				t.Fatalf("got %v (code %s), want code %s", err, got, tc.code)
			}
			untouched(t, "the destination", D)
		})
	}
	tr := good()
	if _, err := pre.Client.Do(context.Background(), tr); err != nil {
		t.Fatalf("a good small push after the refusals: %v", err)
	}
	if err := kvsim.Verify(S, D, []kvsim.Move{{Layer: 0, SrcOff: 0, DstOff: 4096, Len: 8192}}, guard); err != nil {
		t.Fatal(err)
	}
	if inlineCount(pre) == 0 {
		t.Error("no push took the latency path")
	}
}

// TestPollingClient: with every reader polling instead of sleeping (the
// engine's client.WithSpin, the sidecars' staging.read_spin), small
// pushes still land byte-exact and each Do returns its own answer, also
// with several goroutines sharing the client.
func TestPollingClient(t *testing.T) {
	o := e2eOpts()
	o.Slots = 8
	o.Configure = func(_ string, c *config.Config) { c.Staging.ReadSpin = config.Spin(50 * time.Microsecond) }
	pre, dec := proxytest.Pair(t, o)
	S, D := caches(t, pre, dec, 2, 1<<20)
	cl := pre.Dial(t, client.WithSpin(50*time.Microsecond)) // in the group that registered S
	ctx := context.Background()
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		go func() {
			for i := 0; i < 25; i++ {
				off := uint64(g*25+i) * 4096
				ms := []kvsim.Move{{Layer: g % 2, SrcOff: off, DstOff: off, Len: 4096}}
				if _, err := cl.Do(ctx, kvsim.Transfer(route, wire.Push, fmt.Sprintf("spin-%d-%d", g, i), S, D, ms)); err != nil {
					errs <- fmt.Errorf("push %d of goroutine %d: %w", i, g, err)
					return
				}
				if err := kvsim.Verify(S, D, ms, guard); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for g := 0; g < 4; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
