package proxy

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/wire"
)

// recvXfer is an incoming transfer of count chunks of 8 B on a session
// that records what it sends instead of sending it.
func recvXfer(count uint32) (*inXfer, *[]wire.Msg) {
	s := &Server{log: zap.NewNop()}
	ss := testSession(true)
	ss.s, ss.link = s, &counters{}
	var mu sync.Mutex
	var sent []wire.Msg
	ss.sent = func(m wire.Msg) { mu.Lock(); sent = append(sent, m); mu.Unlock() }
	x := &inXfer{s: s, ss: ss, wireID: 4, total: 8 * uint64(count), count: count, bits: make([]uint64, (count+63)/64)}
	ss.in[x.wireID] = x
	return x, &sent
}

// A chunk sent again after a stream loss may land twice. The receiver must
// answer it once: a second Ack would return a second credit for one the
// sender took (its credits would drift upward, unbounding what it has in
// flight), and counting its bytes twice would report the transfer done
// before every chunk landed.
func TestSecondCopyAnsweredOnce(t *testing.T) {
	ack := func(c uint32) wire.Msg { return &wire.Ack{Transfer: 4, Chunks: []uint32{c}} }
	for _, tc := range []struct {
		name   string
		lands  []uint32 // chunk indices landing, in order
		want   []wire.Msg
		done   bool
		landed uint32
	}{
		{"in order", []uint32{0, 1, 2}, []wire.Msg{ack(0), ack(1), ack(2)}, true, 3},
		{"a second copy before the end", []uint32{0, 1, 1}, []wire.Msg{ack(0), ack(1)}, false, 2},
		{"a second copy cannot complete", []uint32{0, 0, 1, 1}, []wire.Msg{ack(0), ack(1)}, false, 2},
		{"a second copy after the end", []uint32{2, 1, 0, 1}, []wire.Msg{ack(2), ack(1), ack(0)}, true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, sent := recvXfer(3)
			for _, c := range tc.lands {
				x.landed(c, 8, nil)
			}
			if !reflect.DeepEqual(*sent, tc.want) {
				t.Fatalf("sent %s, want %s", msgs(*sent), msgs(tc.want))
			}
			if x.finished != tc.done || x.nLanded != tc.landed || x.bytes != 8*uint64(tc.landed) {
				t.Fatalf("finished %v, %d chunks, %d B; want %v, %d chunks, %d B", x.finished, x.nLanded, x.bytes, tc.done, tc.landed, 8*tc.landed)
			}
			if dups := uint64(len(tc.lands)) - uint64(tc.landed); x.ss.link.Duplicates.Load() != dups {
				t.Fatalf("counted %d duplicates, want %d", x.ss.link.Duplicates.Load(), dups)
			}
		})
	}
}

// Chunks of a finished transfer that will not land: a second copy of one
// that landed is answered with nothing; any other returns its credit.
func TestLateChunksOfFinishedTransfer(t *testing.T) {
	x, sent := recvXfer(2)
	x.landed(0, 8, nil)
	x.fail(errors.New("peer gave up"), false)
	*sent = nil
	x.landed(0, 8, nil) // a second copy, landed before the failure
	x.landed(1, 8, nil) // never landed before
	if want := []wire.Msg{&wire.Credit{Grant: 1}}; !reflect.DeepEqual(*sent, want) {
		t.Fatalf("sent %s, want %s", msgs(*sent), msgs(want))
	}
	ss := x.ss
	if _, ok := ss.gone[4]; !ok || ss.gone[4] {
		t.Fatalf("failed transfer's tombstone: %v, %v; want present, not complete", ok, ss.gone[4])
	}
	ch := &wire.Chunk{Transfer: 4, Index: 1}
	if ss.secondCopy(nil, nil, ch) {
		t.Fatal("a chunk of a failed transfer counted as a second copy")
	}
	if !ss.secondCopy(x, errFinished, &wire.Chunk{Transfer: 4, Index: 0}) {
		t.Fatal("a second copy of a landed chunk of a failed transfer was not recognised")
	}
	// Once the transfer is forgotten (x nil), its landed bitmap still
	// tells a second copy from a chunk that never landed (PROTOCOL 8.7).
	if !ss.secondCopy(nil, nil, &wire.Chunk{Transfer: 4, Index: 0}) {
		t.Fatal("a second copy of a landed chunk of a forgotten failed transfer was not recognised")
	}

	y, _ := recvXfer(1)
	y.landed(0, 8, nil)
	if !y.ss.gone[4] {
		t.Fatal("a complete transfer's tombstone does not say complete")
	}
	if !y.ss.secondCopy(nil, nil, ch) {
		t.Fatal("a late chunk of a complete transfer was not taken for a second copy")
	}
}

// A damaged chunk asks for a resend (which returns the chunk's credit);
// a damaged second copy of a landed chunk is answered with nothing.
func TestDamagedChunk(t *testing.T) {
	x, sent := recvXfer(2)
	x.ss.peerName = "peer"
	x.ss.damaged(x, &wire.Chunk{Transfer: 4, Index: 1}, 1, 2)
	x.landed(0, 8, nil)
	x.ss.damaged(x, &wire.Chunk{Transfer: 4, Index: 0}, 1, 2)
	want := []wire.Msg{&wire.Resend{Transfer: 4, Chunk: 1}, &wire.Ack{Transfer: 4, Chunks: []uint32{0}}}
	if !reflect.DeepEqual(*sent, want) {
		t.Fatalf("sent %s, want %s", msgs(*sent), msgs(want))
	}
	if n := x.ss.link.ChecksumErrors.Load(); n != 2 {
		t.Fatalf("counted %d checksum errors, want 2", n)
	}
	if x.finished {
		t.Fatal("a damaged chunk failed the transfer; it should be sent again")
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

// The landed bitmaps of failed transfers are bounded per session, and
// go with their tombstones.
func TestGoneBitsBounded(t *testing.T) {
	ss := &session{gone: map[uint64]bool{}, announce: sync.NewCond(new(sync.Mutex))}
	half := make([]uint64, maxGoneBitWords/2)
	half[0] = 1 // chunk 0 landed
	for id := uint64(1); id <= 3; id++ {
		ss.buryLocked(id, false)
		ss.keepBitsLocked(id, half)
	}
	if ss.bitWords != maxGoneBitWords {
		t.Fatalf("holding %d words, want %d (the third bitmap over the budget dropped)", ss.bitWords, maxGoneBitWords)
	}
	for _, tt := range []struct {
		id   uint64
		idx  uint32
		want bool
	}{{1, 0, true}, {1, 1, false}, {2, 0, true}, {3, 0, false}, {1, 1 << 30, false}} {
		if got := ss.landedGoneLocked(tt.id, tt.idx); got != tt.want {
			t.Errorf("transfer %d chunk %d: landed %v, want %v", tt.id, tt.idx, got, tt.want)
		}
	}
	for id := uint64(10); len(ss.goneBits) > 0; id++ { // evict the oldest tombstones
		ss.buryLocked(id, true)
		if id > 10+maxGone {
			t.Fatal("bitmaps outlived their tombstones")
		}
	}
	if ss.bitWords != 0 {
		t.Fatalf("%d words still counted with no bitmap kept", ss.bitWords)
	}
}

// A transfer's first chunk sets its chunk count (check, on a data
// stream's goroutine) while the sender loop's stall check reads it for
// its message: both must hold the transfer's lock, or the race detector
// (go test -race) fails this test. The stream lands first chunks over and
// over while the loop times the transfer out over and over.
func TestStallCheckRacesFirstChunk(t *testing.T) {
	x, sent := recvXfer(0)
	x.timeout = time.Nanosecond
	first := &wire.Chunk{Transfer: 4, Index: 0, Count: 2}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the data stream
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			x.mu.Lock()
			x.count = 0 // a first chunk again
			x.mu.Unlock()
			_, _ = x.check(first, nil)
		}
	}()
	const rounds = 200
	for range rounds { // the sender loop
		x.mu.Lock()
		x.finished = false
		x.mu.Unlock()
		x.ss.mu.Lock()
		x.ss.in[x.wireID] = x
		x.ss.mu.Unlock()
		x.ss.checkStalled(time.Now())
	}
	close(stop)
	wg.Wait()
	if len(*sent) != rounds {
		t.Fatalf("sent %d messages, want %d timeout Nacks", len(*sent), rounds)
	}
	for _, m := range *sent {
		if n, ok := m.(*wire.Nack); !ok || n.Code != wire.CodeTimeout || !strings.HasPrefix(n.Message, "no chunk landed for 1ns (0 of ") {
			t.Fatalf("sent %s; want a timeout Nack", msgs([]wire.Msg{m}))
		}
	}
}
