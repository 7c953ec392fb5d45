package scenarios_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// relayed starts a receiver ("decode") and a sender ("prefill") whose
// route to it goes through a relay, and waits for the session; both must
// be idle at the end.
func relayed(t *testing.T, stripes int, configure func(string, *config.Config)) (pre, dec *proxytest.Sidecar, r *relay) {
	t.Helper()
	proxytest.NoLeaks(t)
	o := e2eOpts()
	o.Stripes, o.Configure = stripes, configure
	dec = proxytest.Start(t, "decode", "", o)
	r = newRelay(t, dec.PeerAddr())
	pre = proxytest.Start(t, "prefill", r.addr(), o)
	pre.ExpectIdle(t, 1)
	dec.ExpectIdle(t, 1)
	return pre, dec, r
}

// streamsUp is how many data streams sc's one route's session has now.
func streamsUp(t *testing.T, sc *proxytest.Sidecar) int {
	t.Helper()
	rs, err := sc.Client.Routes(context.Background())
	if err != nil || len(rs) != 1 || len(rs[0].Peers) != 1 {
		t.Fatalf("routes: %+v, %v", rs, err)
	}
	return rs[0].Peers[0].StreamsUp
}

// TestStreamRedial: two of four data streams are cut during a push. The
// push completes byte-exact on the others, the sender redials both, the
// stripe count comes back to four, a second push verifies too, and no
// goroutine, fd or slot leaks on either side (checked at cleanup). Both
// send paths: with splice send the chunks held for the cut streams are
// given up and their slots get fresh pages before reuse (without that,
// this test corrupts data), with writev they simply go again.
func TestStreamRedial(t *testing.T) {
	for _, tc := range []struct {
		name   string
		splice bool
		logs   []string // in the sender's log at start (stream_depth auto follows the send mode)
	}{
		{"splice", true, []string{spliceOn, `"splice_send": true, "stream_depth": 3`}},
		{"writev", false, []string{`"splice_send": false, "stream_depth": 1`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pre, dec, r := relayed(t, 4, func(name string, c *config.Config) {
				if name == "decode" {
					c.Device.Hostmem.BandwidthGBps = 0.1
				} else {
					splice(tc.splice)(name, c)
				}
			})
			for _, l := range tc.logs {
				waitLogged(t, pre, l)
			}
			cutTwoStreams(t, pre, dec, r)
		})
	}
}

func cutTwoStreams(t *testing.T, pre, dec *proxytest.Sidecar, r *relay) {
	t.Helper()
	S, D := caches(t, pre, dec, 1, 48<<20)
	ms := kvsim.Ranges(S, 1<<20)
	done := make(chan error, 1)
	go func() {
		_, err := pre.Client.Do(context.Background(), kvsim.Transfer(route, wire.Push, "cut", S, D, ms))
		done <- err
	}()
	time.Sleep(150 * time.Millisecond)
	for _, idx := range []uint16{1, 2} {
		if !r.cut(idx) {
			t.Fatalf("no data stream %d to cut", idx)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("push with two streams cut: %v", err)
	}
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for streamsUp(t, pre) != 4 {
		if time.Now().After(deadline) {
			t.Fatalf("%d data streams up 10s after the cut, want 4", streamsUp(t, pre))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := link(t, pre, route).Redials; n != 2 {
		t.Errorf("stream_redials %d, want 2", n)
	}
	if err := D.Poison(guard); err != nil {
		t.Fatal(err)
	}
	run(t, pre.Client, wire.Push, "after-redial", S, D, ms)
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedChunk: with CRC32C on, a chunk damaged in flight is sent
// again and the push lands byte-exact, with one resend counted on the
// sender and one checksum error on the receiver. Chunks damaged on every
// try fail the push cleanly after the resend bound, with a checksum
// error; credits stay balanced, so the next push still works. A damaged
// small (inline) push fails with a checksum error, and is not sent again.
func TestDamagedChunk(t *testing.T) {
	pre, dec, r := relayed(t, 2, nil)
	S, D := caches(t, pre, dec, 1, 16<<20)
	ms := kvsim.Ranges(S, 1<<20)
	push := func(tag string, ms []kvsim.Move) error {
		tr := kvsim.Transfer(route, wire.Push, tag, S, D, ms)
		tr.Checksum = wire.ChecksumOn
		_, err := pre.Client.Do(context.Background(), tr)
		return err
	}
	third := func(n int64) bool { return n == 3 }
	r.damage.Store(&third)
	if err := push("one-damaged", ms); err != nil {
		t.Fatalf("push with one damaged chunk: %v", err)
	}
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
	if n := link(t, pre, route).Resends; n != 1 {
		t.Errorf("sender: chunks_resent %d, want 1", n)
	}
	if n := link(t, dec, wire.InboundLink).ChecksumErrors; n != 1 {
		t.Errorf("receiver: checksum_errors %d, want 1", n)
	}

	all := func(int64) bool { return true }
	r.damage.Store(&all)
	err := push("all-damaged", ms)
	if client.CodeOf(err) != wire.CodeChecksum || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("push with every chunk damaged: got %v, want a checksum error naming the damaged chunk", err)
	}
	t.Logf("persistent damage: %v", err)

	small := []kvsim.Move{{Layer: 0, SrcOff: 4096, DstOff: 8192, Len: 4096}}
	err = push("small-damaged", small)
	if client.CodeOf(err) != wire.CodeChecksum {
		t.Fatalf("small push damaged: got %v, want a checksum error", err)
	}

	r.damage.Store(nil)
	if err := D.Poison(guard); err != nil {
		t.Fatal(err)
	}
	if err := push("clean", ms); err != nil {
		t.Fatalf("push after the damage stopped: %v", err)
	}
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
}
