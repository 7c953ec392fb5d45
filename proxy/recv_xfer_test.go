package proxy

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// recvXfer is an open incoming push of count chunks of 8 B (no segments:
// nothing to check against regions) on a session that records what it
// sends instead of sending it.
func recvXfer(t *testing.T, count uint32) (*inXfer, *[]wire.Msg) {
	t.Helper()
	s := &Server{log: zap.NewNop()}
	ss := testSession(true)
	ss.s, ss.link = s, &counters{}
	var mu sync.Mutex
	var sent []wire.Msg
	ss.sent = func(m wire.Msg) { mu.Lock(); sent = append(sent, m); mu.Unlock() }
	x := &inXfer{s: s, ss: ss, wireID: 4, end: peerPush{}, total: 8 * uint64(count), dest: byteDest{}}
	if err := ss.in.open(x); err != nil {
		t.Fatal(err)
	}
	return x, &sent
}

// arrive is chunk c of x's count arriving and held, as a data stream's
// admit or a ring's resolve takes it.
func arrive(t *testing.T, x *inXfer, c, count uint32) {
	t.Helper()
	if _, err := x.resolve(&wire.Chunk{Transfer: x.wireID, Index: c, Count: count}, nil); err != nil {
		t.Fatalf("chunk %d: %v", c, err)
	}
}

// A chunk sent again after a stream loss may land twice. The receiver must
// answer it once: a second Ack would return a second credit for one the
// sender took, and counting its bytes twice would report the transfer
// done before every chunk landed.
func TestSecondCopyAnsweredOnce(t *testing.T) {
	ack := func(c uint32) wire.Msg { return &wire.Ack{Transfer: 4, Chunks: []uint32{c}} }
	for _, tc := range []struct {
		name  string
		lands []uint32 // chunk indices landing, in order
		want  []wire.Msg
		done  bool
	}{
		{"in order", []uint32{0, 1, 2}, []wire.Msg{ack(0), ack(1), ack(2)}, true},
		{"a second copy before the end", []uint32{0, 1, 1}, []wire.Msg{ack(0), ack(1)}, false},
		{"a second copy cannot complete", []uint32{0, 0, 1, 1}, []wire.Msg{ack(0), ack(1)}, false},
		{"a second copy after the end", []uint32{2, 1, 0, 1}, []wire.Msg{ack(2), ack(1), ack(0)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, sent := recvXfer(t, 3)
			landed := map[uint32]bool{}
			for _, c := range tc.lands {
				if !landed[c] || x.ss.in.lookup(4) != nil {
					arrive(t, x, c, 3)
				}
				landed[c] = true
				x.landed(c, 8, nil)
			}
			if !reflect.DeepEqual(*sent, tc.want) {
				t.Fatalf("sent %s, want %s", msgs(*sent), msgs(tc.want))
			}
			if done := x.ss.in.lookup(4) == nil; done != tc.done {
				t.Fatalf("finished %v, want %v", done, tc.done)
			}
			if dups := uint64(len(tc.lands) - len(landed)); x.ss.link.Duplicates.Load() != dups {
				t.Fatalf("counted %d duplicates, want %d", x.ss.link.Duplicates.Load(), dups)
			}
		})
	}
}

// What the core decides about a chunk of a failed transfer reaches the
// peer: a Credit for one that never landed, nothing for a second copy;
// the failure itself as a Nack with the error's code.
func TestLateChunksOfFailedTransfer(t *testing.T) {
	x, sent := recvXfer(t, 2)
	arrive(t, x, 0, 2)
	x.landed(0, 8, nil)
	x.release()
	x.fail(codeErr(wire.CodeDevice, "device lost"), true)
	for _, c := range []uint32{0, 1} {
		x.ss.in.recv(staging.RecvEvent{Kind: staging.RxChunk, Transfer: 4, Chunk: c, Count: 2}, nil)
	}
	want := []wire.Msg{&wire.Ack{Transfer: 4, Chunks: []uint32{0}}, &wire.Nack{Transfer: 4, Code: wire.CodeDevice, Message: "device lost"}, &wire.Credit{Grant: 1}}
	if !reflect.DeepEqual(*sent, want) {
		t.Fatalf("sent %s, want %s", msgs(*sent), msgs(want))
	}
	if n := x.ss.link.XfersFailed.Load(); n != 1 {
		t.Fatalf("counted %d failed transfers, want 1", n)
	}
}

// A damaged chunk asks for a resend (which returns the chunk's credit);
// a damaged second copy of a landed chunk is answered with nothing.
func TestDamagedChunk(t *testing.T) {
	x, sent := recvXfer(t, 2)
	x.ss.peerName = "peer"
	arrive(t, x, 1, 2)
	x.ss.in.damaged(x, &wire.Chunk{Transfer: 4, Index: 1}, 1, 2)
	arrive(t, x, 0, 2)
	x.landed(0, 8, nil)
	x.ss.in.damaged(x, &wire.Chunk{Transfer: 4, Index: 0}, 1, 2)
	want := []wire.Msg{&wire.Resend{Transfer: 4, Chunk: 1}, &wire.Ack{Transfer: 4, Chunks: []uint32{0}}}
	if !reflect.DeepEqual(*sent, want) {
		t.Fatalf("sent %s, want %s", msgs(*sent), msgs(want))
	}
	if n := x.ss.link.ChecksumErrors.Load(); n != 2 {
		t.Fatalf("counted %d checksum errors, want 2", n)
	}
	if x.ss.in.lookup(4) == nil {
		t.Fatal("a damaged chunk failed the transfer; it should be sent again")
	}
}

// The core's errors reach peers and engines with their wire codes.
func TestRecvErrCodes(t *testing.T) {
	r := staging.NewReceiver(1)
	step := func(ev staging.RecvEvent) error {
		var out staging.RecvReady
		r.Step(ev, &out)
		if out.Err != nil {
			return out.Err
		}
		if len(out.Nacks) > 0 {
			return out.Nacks[0].Err
		}
		return nil
	}
	now := time.Unix(10, 0)
	step(staging.RecvEvent{Kind: staging.RxOpen, Transfer: 2, Total: 8, Timeout: time.Second, Now: now})
	device := codeErr(wire.CodeDevice, "scatter failed")
	for _, tc := range []struct {
		err  error
		code wire.Code
	}{
		{step(staging.RecvEvent{Kind: staging.RxOpen, Transfer: 2, Total: 8}), wire.CodeExists},
		{step(staging.RecvEvent{Kind: staging.RxOpen, Transfer: 4, Total: 8}), wire.CodeBusy},
		{step(staging.RecvEvent{Kind: staging.RxChunk, Transfer: 2, Count: 9}), wire.CodeMalformed},
		{device, wire.CodeDevice},
	} {
		if got := errCode(recvErr(tc.err)); got != tc.code || recvErr(tc.err).Error() != tc.err.Error() {
			t.Errorf("%v: code %v, message %q; want %v and the same message", tc.err, got, recvErr(tc.err), tc.code)
		}
	}
	step(staging.RecvEvent{Kind: staging.RxOpen, Transfer: 6, Total: 8, Timeout: time.Second, Now: now})
	if err := step(staging.RecvEvent{Kind: staging.RxTick, Now: now.Add(time.Hour)}); errCode(recvErr(err)) != wire.CodeTimeout {
		t.Errorf("stalled transfer: %v, want a timeout", recvErr(err))
	}
	if err := recvErr(staging.ErrClosed); err != errSessionGone {
		t.Errorf("closed session: %v, want errSessionGone", err)
	}
	if err := recvErr(staging.ErrFinished); err != staging.ErrFinished {
		t.Errorf("finished transfer: %v, want staging.ErrFinished itself", err)
	}
}

// msgs prints frames with their fields, for failure messages.
func msgs(ms []wire.Msg) string {
	out := "["
	for i, m := range ms {
		if i > 0 {
			out += " "
		}
		out += fmt.Sprintf("%s%+v", m.Type(), m)
	}
	return out + "]"
}

// A data stream checks chunks of a transfer while the sender loop's tick
// times transfers out, and a close fails them all: the race detector (go
// test -race) sees whether every path steps the core under the session's
// lock. Every open transfer ends exactly once, with a timeout Nack or
// the close.
func TestTickRacesChunks(t *testing.T) {
	x, sent := recvXfer(t, 2)
	ss := x.ss
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the data stream
		defer wg.Done()
		for c := uint32(0); ; c++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := x.resolve(&wire.Chunk{Transfer: 4, Index: c % 2, Count: 2}, nil); err == nil {
				x.release()
			}
		}
	}()
	const rounds = 200
	for i := range rounds { // the sender loop
		y := &inXfer{s: ss.s, ss: ss, wireID: uint64(10 + 2*i), end: peerPush{}, total: 16, dest: byteDest{}, timeout: time.Nanosecond}
		if err := ss.in.open(y); err != nil {
			t.Fatal(err)
		}
		ss.in.tick(time.Now().Add(time.Second))
	}
	close(stop)
	wg.Wait()
	nacks := 0
	for _, m := range *sent {
		if n, ok := m.(*wire.Nack); ok {
			nacks++
			if n.Code != wire.CodeTimeout || !strings.HasPrefix(n.Message, "no chunk landed for 1ns (0 of ") {
				t.Fatalf("sent %s; want a timeout Nack", msgs([]wire.Msg{m}))
			}
		}
	}
	if nacks != rounds {
		t.Fatalf("sent %d timeout Nacks, want %d", nacks, rounds)
	}
	if ss.in.lookup(4) == nil {
		t.Fatal("the transfer without a timeout was failed")
	}
}
