package netns

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stage-kv/stage/wire"
)

// forgedCredit (issue 16 item 5): a raw peer pulls the victim region (four
// chunks of 256 KiB) with a window of one chunk. Acks of chunks that do
// not exist (1000, 2^32-1), of one never sent (2), and of an unknown
// transfer must return no credit: chunk 1 comes only after chunk 0's own
// Ack, and a repeated Ack of chunk 0 does not let chunk 2 out either.
func forgedCredit(t *testing.T, h *hostileLab) {
	raw := *h.raw
	raw.window = 1
	s := raw.handshake()
	ds := raw.attach(s, 0)
	const id = 1 // the dialer's ids are odd
	raw.send(s.c, frame(&wire.PullRequest{Transfer: id, Tag: "forged-credit", SrcRegions: []string{h.victim.Region(0)},
		Ops: []wire.Op{{Len: victimBytes}}}))
	expect[*wire.Accept](t, s.c, "Accept")
	if c := readChunkIndex(t, ds, 5*time.Second); c != 0 {
		t.Fatalf("first chunk is %d, want 0", c)
	}
	ack := func(transfer uint64, chunks ...uint32) []byte {
		return frame(&wire.Ack{Transfer: transfer, Chunks: chunks})
	}
	raw.send(s.c, ack(id, 1000), ack(id, 1<<32-1), ack(id, 2), ack(id, 2, 3, 3), ack(id+2, 0))
	noChunk(t, ds, "forged Acks")
	raw.send(s.c, ack(id, 0))
	if c := readChunkIndex(t, ds, 5*time.Second); c != 1 {
		t.Fatalf("after chunk 0's Ack got chunk %d, want 1", c)
	}
	raw.send(s.c, ack(id, 0))
	noChunk(t, ds, "a second Ack of chunk 0")
	for want := uint32(1); want < 4; want++ {
		raw.send(s.c, ack(id, want))
		if want < 3 {
			if c := readChunkIndex(t, ds, 5*time.Second); c != want+1 {
				t.Fatalf("after chunk %d's Ack got chunk %d", want, c)
			}
		}
	}
	_ = s.c.Close()
	_ = ds.Close()
}

// readChunkIndex reads the next chunk frame on data stream c (within d)
// and returns its index.
func readChunkIndex(t *testing.T, c net.Conn, d time.Duration) uint32 {
	t.Helper()
	ch, _, err := readChunk(c, d)
	if err != nil {
		t.Fatalf("read a chunk: %v", err)
	}
	return ch.Index
}

// noChunk requires nothing to arrive on c for a second.
func noChunk(t *testing.T, c net.Conn, after string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	var b [1]byte
	_, err := c.Read(b[:])
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("after %s, with no credit left, the data stream gave %v: a chunk went out on a forged credit", after, err)
	}
}
