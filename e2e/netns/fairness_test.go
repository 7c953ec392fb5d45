package netns

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// fairLab is decode, a normal peer B (prefill) that pulls from and pushes
// to it, and a raw peer A with the token in a third namespace.
type fairLab struct {
	dec, pre      *sidecar
	pulls, pushes *pushes
	big           *kvsim.Cache // on decode, for A
	raw           *rawPeer
	before        float64 // B's MB/s alone
}

// newFairLab starts the sidecars and measures B alone.
func newFairLab(t *testing.T, l *lab) *fairLab {
	t.Helper()
	f := &fairLab{}
	f.dec = startSidecar(t, l, 1, spec{name: "decode", slotSize: "1MiB", slots: 64})
	f.pre = startSidecar(t, l, 0, spec{name: "prefill", slotSize: "1MiB", slots: 64,
		routes: []route{{name: "decode", peer: f.dec.addr(), progress: 10 * time.Second}}})
	f.pre.waitSessions(1, 15*time.Second)
	const layerBytes = 16 << 20
	f.pulls = newPulls(t, "b-pulls", f.pre, f.dec, "decode", 1, layerBytes)
	f.pushes = newPushes(t, "b-pushes", f.pre, f.dec, "decode", 1, layerBytes)
	f.pulls.attempts, f.pushes.attempts = 1, 1 // B's transfers must not fail at all
	var err error
	if f.big, err = kvsim.New("a-mem", 1, 512<<20, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.big.Close() })
	if err := f.big.Register(context.Background(), f.dec.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	f.raw = &rawPeer{t: t, ns: l.NS[2], addr: f.dec.addr(), token: labToken, slot: 1 << 20, window: 4096}
	f.before = bRate(t, f.pulls, f.pushes, 0, 6)
	t.Logf("peer B alone: %.0f MB/s (6 pulls and 6 pushes of 16 MiB at once)", f.before)
	return f
}

// stuckPeer opens A's session with n data streams and keeps its control
// session alive (heartbeats, its frames read) until the returned func.
func (f *fairLab) stuckPeer(n int) (*rawSession, []net.Conn, func()) {
	a := f.raw.handshake()
	var streams []net.Conn
	for i := 0; i < n; i++ {
		streams = append(streams, f.raw.attach(a, uint16(i)))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // A is stuck, not gone: its session stays up
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			_ = a.c.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := a.c.Write(frame(&wire.Heartbeat{})); err != nil {
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		_, _ = io.Copy(io.Discard, a.c)
	}()
	return a, streams, func() {
		close(stop)
		_ = a.c.Close()
		for _, c := range streams {
			_ = c.Close()
		}
		wg.Wait()
	}
}

// during measures B while A is stuck, waits for decode to drop A's
// streams, and checks that everything is back to idle.
func (f *fairLab) during(t *testing.T, mark int64, base idle, what string) {
	t.Helper()
	st := f.dec.stats()
	t.Logf("A %s: decode's slots in use: send %d of %d, receive %d of %d", what, st.SendInUse, st.SendSlots, st.RecvInUse, st.RecvSlots)
	start := time.Now()
	rate := bRate(t, f.pulls, f.pushes, 100, 30)
	t.Logf("peer B while A %s (and after decode drops A's streams): %.0f MB/s (%.0f%% of alone), all 60 transfers done in %v",
		what, rate, 100*rate/f.before, time.Since(start).Round(time.Millisecond))
	f.dec.waitLogged(t, mark, "data stream stalled", "hostile")
}

// TestStalledPeerDoesNotStarve (issue 16 item 3): peer A asks decode for a
// 512 MiB pull over 32 data streams with a window of 4096 chunks and then
// reads none of them. Every one of B's pulls and pushes meanwhile must
// finish, without a retry; decode drops A's stalled streams
// (staging.stall_timeout), fails A's pull and goes back to idle. On the
// old code A pinned all 32 send slots and B's first pull failed with "no
// chunk landed for 10s".
func TestStalledPeerDoesNotStarve(t *testing.T) {
	l := inLab(t, 3)
	if l == nil {
		return
	}
	f := newFairLab(t, l)
	base := f.dec.baseline()
	a, _, stop := f.stuckPeer(32)
	mark := f.dec.logMark()
	f.raw.send(a.c, frame(&wire.PullRequest{Transfer: 1, Tag: "a-stalls", SrcRegions: []string{f.big.Region(0)},
		Ops: []wire.Op{{Len: f.big.LayerBytes}}}))
	for deadline := time.Now().Add(5 * time.Second); f.dec.stats().SendInUse < 16 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	f.during(t, mark, base, "stops reading")
	stop()
	f.pulls.check()
	f.pushes.check()
	f.dec.checkIdle(base)
}

// TestHalfSentPeerDoesNotStarve: peer A announces a push to decode and, on
// each of 32 data streams, sends a 1 MiB chunk's header and 1 KiB of its
// payload, then nothing: each of decode's readers of A's streams holds a
// receive slot. B's pushes (and pulls) meanwhile must all finish; decode
// drops A's streams and goes back to idle.
func TestHalfSentPeerDoesNotStarve(t *testing.T) {
	l := inLab(t, 3)
	if l == nil {
		return
	}
	f := newFairLab(t, l)
	base := f.dec.baseline()
	a, streams, stop := f.stuckPeer(32)
	mark := f.dec.logMark()
	const chunk = 1 << 20
	f.raw.send(a.c, frame(&wire.Announce{Transfer: 1, Tag: "a-half-sent", Total: uint64(len(streams)) * chunk,
		Regions: []string{f.big.Region(0)}, Ends: []uint64{uint64(len(streams)) * chunk}}))
	head := make([]byte, 0, 128)
	for i, c := range streams {
		ch := &wire.Chunk{Transfer: 1, Index: uint32(i), Count: uint32(len(streams)), PayloadLen: chunk,
			Segs: []wire.ChunkSeg{{Region: 0, Len: chunk, Offset: uint64(i) * chunk}}}
		head = wire.AppendChunkHead(head[:0], ch, nil, false, 0)
		f.raw.send(c, head, make([]byte, 1024))
	}
	for deadline := time.Now().Add(5 * time.Second); f.dec.stats().RecvInUse < 16 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	f.during(t, mark, base, "stops mid-chunk")
	stop()
	f.pulls.check()
	f.pushes.check()
	f.dec.checkIdle(base)
}

// bRate runs n pulls and n pushes of B at once (transfers from..from+n-1)
// and returns their throughput in MB/s; any failure fails the test.
func bRate(t *testing.T, pl, ps *pushes, from, n int) float64 {
	t.Helper()
	ctx := context.Background()
	moved := func() uint64 {
		var b uint64
		for _, p := range []*pushes{pl, ps} {
			p.mu.Lock()
			b += p.bytes
			p.mu.Unlock()
		}
		return b
	}
	b0, start := moved(), time.Now()
	errs := make(chan error, 2)
	for _, p := range []*pushes{pl, ps} {
		go func() { errs <- p.runRange(ctx, from, from+n) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("peer B: %v", err)
		}
	}
	return float64(moved()-b0) / time.Since(start).Seconds() / 1e6
}
