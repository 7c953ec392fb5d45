package netns

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// victimBytes is the size of the region hostile frames aim at; guard
// bytes of victimGuard lie on both sides of it in the same allocation.
const (
	victimBytes = 1 << 20
	victimGuard = 64 << 10
)

// hostileLab is a receiver "decode" with a victim region, its legitimate
// peer "prefill", and a raw peer in a third namespace that knows the
// token (a compromised or broken peer) unless a case says otherwise.
type hostileLab struct {
	pre, dec *sidecar
	raw      *rawPeer
	victim   *kvsim.Cache
	seq      int // numbers the hostile pushes' tags
}

// intact fails t unless every byte of the victim's allocation, guards
// included, still holds the poison.
func (h *hostileLab) intact(t *testing.T) {
	t.Helper()
	all, err := h.victim.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range all {
		if v == guard {
			continue
		}
		where := "inside the region"
		if i < victimGuard || i >= victimGuard+victimBytes {
			where = "in the guard bytes around it"
		}
		t.Fatalf("byte %d of the victim's allocation (%s) was written: %#02x", i, where, v)
	}
}

// announce sends an Announce of total bytes into the victim region,
// writing up to end, and reads the answer: Accept, or the Nack returned.
func (h *hostileLab) announce(t *testing.T, s *rawSession, id, total, end uint64, region string) *wire.Nack {
	t.Helper()
	h.seq++
	h.raw.send(s.c, frame(&wire.Announce{Transfer: id, Tag: fmt.Sprintf("hostile-%d.%d", h.seq, id), Total: total,
		Regions: []string{region}, Ends: []uint64{end}}))
	switch m := expect[wire.Msg](t, s.c, "Accept or Nack").(type) {
	case *wire.Accept:
		if m.Transfer != id {
			t.Fatalf("Accept of transfer %d, want %d", m.Transfer, id)
		}
		return nil
	case *wire.Nack:
		if m.Transfer != id {
			t.Fatalf("Nack of transfer %d, want %d", m.Transfer, id)
		}
		return m
	default:
		t.Fatalf("answer to Announce: %s %+v", m.Type(), m)
	}
	return nil
}

// nacked requires the next answer on s to be a Nack of id with code.
func nacked(t *testing.T, s *rawSession, id uint64, code wire.Code) {
	t.Helper()
	n := expect[*wire.Nack](t, s.c, "Nack")
	if n.Transfer != id || n.Code != code {
		t.Fatalf("got Nack of transfer %d, %s (%q), want transfer %d, %s", n.Transfer, n.Code, n.Message, id, code)
	}
}

// hostileCase is one attack: run does it and checks the refusal on the
// wire; logged lists fragments of the line the sidecar must log.
type hostileCase struct {
	name   string
	run    func(t *testing.T, h *hostileLab)
	logged [][]string
}

// TestHostilePeer (issue 7): a raw TCP peer in a namespace of its own
// sends the receiver what no sidecar would: a wrong token proof, a
// replayed handshake, forged Acks and Nacks for a transfer of another
// session, chunks out of their region, huge declared lengths and
// truncated frames. Each is refused (the frame answered as the protocol
// says, or the connection closed) and logged (a forged Ack or Nack once
// per session and frame type: a late answer looks the same); no byte of the victim
// region or its guards changes; the legitimate peer's session stays up
// throughout, a pull it makes while the forged frames arrive lands
// whole, its pushes land after; and the receiver goes back to idle.
func TestHostilePeer(t *testing.T) {
	l := inLab(t, 3)
	if l == nil {
		return
	}
	pre, dec := pair(t, l, slowDevice, 10*time.Second, direct)
	legit := newPushes(t, "legit", pre, dec, "decode", 1, 4<<20)
	pulled := newPulls(t, "pulled", pre, dec, "decode", 1, 64<<20)
	victim, err := kvsim.New("victim", 1, victimBytes, victimGuard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = victim.Close() })
	if err := victim.Poison(guard); err != nil {
		t.Fatal(err)
	}
	if err := victim.Register(context.Background(), dec.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	decBase := dec.baseline()
	start := dec.logMark()
	h := &hostileLab{pre: pre, dec: dec, victim: victim, raw: &rawPeer{t: t, ns: l.NS[2], addr: dec.addr(), token: labToken}}
	for _, tc := range hostileCases(pulled) {
		t.Run(tc.name, func(t *testing.T) {
			mark := dec.logMark()
			h.raw.t = t
			tc.run(t, h)
			for _, parts := range tc.logged {
				dec.waitLogged(t, mark, parts...)
			}
			h.intact(t)
			if st := pre.stats(); st.Sessions != 1 {
				t.Fatalf("the legitimate peer has %d sessions, want its 1", st.Sessions)
			}
		})
	}
	h.raw.t = t
	for i := 0; i < 3; i++ {
		if err := legit.one(context.Background(), 0, i); err != nil {
			t.Fatalf("a legitimate push after the hostile frames: %v", err)
		}
	}
	for _, line := range strings.Split(dec.logSince(start), "\n") {
		if strings.Contains(line, "session down") && strings.Contains(line, "prefill") {
			t.Errorf("the legitimate peer's session went down: %s", line)
		}
	}
	h.intact(t)
	dec.checkIdle(decBase)
	legit.check()
	pulled.check()
}

// hostileCases lists the attacks; pulled is the legitimate peer's pull
// that the forged frames aim at.
func hostileCases(pulled *pushes) []hostileCase {
	return []hostileCase{
		{name: "wrong token proof", run: func(t *testing.T, h *hostileLab) {
			s := h.raw.hello(h.raw.dial())
			h.raw.send(s.c, frame(&wire.Auth{Proof: proofOf("not-"+labToken, "stage-client", s.nc[:], s.ns[:])}))
			refused(t, s.c, wire.CodeAuthFailed, 3*time.Second)
		}, logged: [][]string{{"refused peer connection", "wrong token proof"}}},

		{name: "replayed handshake", run: replayed,
			logged: [][]string{{"refused peer connection", "wrong proof"}, {"refused peer connection", "wrong token proof"}, {"refused peer connection", "unknown session"}}},

		{name: "forged acks and nacks", run: func(t *testing.T, h *hostileLab) { forged(t, h, pulled) },
			logged: [][]string{{"not in flight on its session", "Ack"}, {"not in flight on its session", "Nack"}}},

		{name: "chunks out of range", run: outOfRange,
			logged: [][]string{{"refused chunk", "past its end"}, {"refused chunk", "region #1"}, {"refused chunk", "impossible"},
				{"refused push", "offset 1048577"}, {"refused push", "nope/0"}, {"refused push", "our parity"}, {"data stream lost", "overflow"}}},

		{name: "huge declared lengths", run: huge,
			logged: [][]string{{"refused peer connection", "first frame"}, {"bad control frame"}, {"data stream lost", "exceeds our slot size"}}},

		{name: "announce at once", run: announceAtOnce},

		{name: "forged acks return no credit", run: forgedCredit,
			logged: [][]string{{"not in flight on its session", "Ack"}}},

		{name: "truncated frames", run: truncated,
			logged: [][]string{{"refused peer connection", "first frame", "EOF"}, {"refused peer connection", "auth", "EOF"}, {"data stream lost", "read chunk payload"}}},
	}
}

// announceAtOnce: a peer that sends its Announce the moment it has the
// Welcome (before the sidecar may have handed the connection to its event
// loop) still gets its answer, every time. The sidecar once dropped such
// an answer, and the peer waited until the session died.
func announceAtOnce(t *testing.T, h *hostileLab) {
	for i := range 40 {
		s := h.raw.handshake()
		if n := h.announce(t, s, 1, 4096, 4096, h.victim.Region(0)); n != nil {
			t.Fatalf("session %d: a valid Announce sent right after the handshake was refused: %s %s", i, n.Code, n.Message)
		}
		if err := s.c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// replayed: a good handshake is recorded (its Hello, Auth and a
// DataHello); its data proof is replayed for another stream of the live
// session, its Hello and Auth on a new connection (the sidecar's fresh
// nonce makes the old proof wrong), and its DataHello once the session
// is gone.
func replayed(t *testing.T, h *hostileLab) {
	s := h.raw.handshake()
	h.raw.attach(s, 0)
	recorded := h.raw.dataHello(s, 0, 0)

	c := h.raw.dial()
	h.raw.send(c, h.raw.dataHello(s, 1, 0))
	refused(t, c, wire.CodeAuthFailed, 3*time.Second)

	c = h.raw.dial()
	h.raw.send(c, s.hello)
	ch := expect[*wire.Challenge](t, c, "Challenge")
	if ch.Nonce == s.ns {
		t.Fatal("the sidecar answered a replayed Hello with the nonce it used before")
	}
	h.raw.send(c, s.auth)
	refused(t, c, wire.CodeAuthFailed, 3*time.Second)

	_ = s.c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for h.dec.stats().Sessions != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the hostile session still up 5s after its connection closed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	c = h.raw.dial()
	h.raw.send(c, recorded)
	refused(t, c, wire.CodeAuthFailed, 3*time.Second)
}

// forged: while the legitimate peer pulls from the receiver, an
// authenticated hostile session sends Acks (every chunk index the pull
// could have) and Nacks for every transfer id up to 4096, then asks for
// the catalog: its answer says the frames before it were handled. The
// pull must still be running then, and must land whole; the receiver
// must notify it once, as landed.
func forged(t *testing.T, h *hostileLab, pulled *pushes) {
	ms := kvsim.Ranges(pulled.S, 1<<20)
	from, _ := pulled.data()
	if err := fillLayer(from, 0, 0xF0F0); err != nil {
		t.Fatal(err)
	}
	done := inFlight(t, pulled, "forged-target")
	s := h.raw.handshake()
	chunks := make([]uint32, 64)
	for i := range chunks {
		chunks[i] = uint32(i)
	}
	var b []byte
	for id := uint64(0); id < 4096; id++ {
		b = wire.AppendFrame(b, &wire.Ack{Transfer: id, Chunks: chunks}, false, 0)
		b = wire.AppendFrame(b, &wire.Nack{Transfer: id, Code: wire.CodeCancelled, Message: "forged"}, false, 0)
	}
	b = wire.AppendFrame(b, &wire.CatalogRequest{Seq: 7}, false, 0)
	h.raw.send(s.c, b)
	if cat := expect[*wire.Catalog](t, s.c, "Catalog"); cat.Seq != 7 {
		t.Fatalf("Catalog %d, want 7", cat.Seq)
	}
	var err error
	select {
	case err = <-done:
		if err == nil {
			t.Fatal("the pull landed before the forged frames were all handled: nothing was shown (make it longer)")
		}
	default:
		err = <-done
	}
	if err != nil {
		t.Fatalf("the legitimate peer's pull failed: another session's forged frames reached it: %v", err)
	}
	if err := pulled.verify(ms); err != nil {
		t.Fatalf("the legitimate pull reported done, but: %v", err)
	}
	n, ok := pulled.book.wait("forged-target", 10*time.Second)
	if !ok || n.Code != wire.CodeOK {
		t.Fatalf("the receiver's notification of the pull: %+v (heard: %v), want landed", n, ok)
	}
	_ = s.c.Close()
}

// outOfRange: an authenticated hostile session announces pushes into the
// victim and sends chunks outside it, and announces pushes the receiver
// must refuse outright.
func outOfRange(t *testing.T, h *hostileLab) {
	s := h.raw.handshake()
	dc := h.raw.attach(s, 0)
	payload := bytes.Repeat([]byte{0x5A}, 4096)
	region := h.victim.Region(0)
	for i, tc := range []struct {
		seg   wire.ChunkSeg
		count uint32
		code  wire.Code
	}{
		{wire.ChunkSeg{Offset: victimBytes - 100}, 1, wire.CodeOutOfRange},          // runs past the end
		{wire.ChunkSeg{Offset: victimBytes}, 1, wire.CodeOutOfRange},                // starts at the end
		{wire.ChunkSeg{Offset: 1 << 40}, 1, wire.CodeOutOfRange},                    // far past it
		{wire.ChunkSeg{Region: 1}, 1, wire.CodeUnknownRegion},                       // the transfer has one region
		{wire.ChunkSeg{}, 1 << 20, wire.CodeMalformed},                              // more chunks than bytes
		{wire.ChunkSeg{Offset: math.MaxUint64 - (1 << 20)}, 1, wire.CodeOutOfRange}, // near 2^64
	} {
		id := uint64(2*i + 1)
		if n := h.announce(t, s, id, uint64(len(payload)), victimBytes, region); n != nil {
			t.Fatalf("a valid Announce was refused: %s %s", n.Code, n.Message)
		}
		tc.seg.Len = uint32(len(payload))
		h.raw.send(dc, chunk(&wire.Chunk{Transfer: id, Count: tc.count, Segs: []wire.ChunkSeg{tc.seg}}, payload))
		nacked(t, s, id, tc.code)
	}
	for i, tc := range []struct {
		id, end uint64
		region  string
		code    wire.Code
	}{
		{101, victimBytes + 1, region, wire.CodeOutOfRange},
		{103, 4096, "nope/0", wire.CodeUnknownRegion},
		{104, 4096, region, wire.CodeMalformed}, // the receiver's parity
	} {
		if n := h.announce(t, s, tc.id, 4096, tc.end, tc.region); n == nil || n.Code != tc.code {
			t.Fatalf("announce %d: got %+v, want a Nack %s", i, n, tc.code)
		}
	}
	// A segment whose offset + length overflows: the frame itself is
	// malformed, and the stream ends (its session with it: it was the
	// only one).
	id := uint64(201)
	if n := h.announce(t, s, id, 4096, victimBytes, region); n != nil {
		t.Fatalf("a valid Announce was refused: %s %s", n.Code, n.Message)
	}
	h.raw.send(dc, chunk(&wire.Chunk{Transfer: id, Count: 1, Segs: []wire.ChunkSeg{{Len: 4096, Offset: math.MaxUint64 - 100}}}, payload))
	refused(t, dc, wire.CodeOK, 3*time.Second)
	refused(t, s.c, wire.CodeOK, 3*time.Second)
}

// huge: lengths far beyond what follows, or beyond every limit; each
// must be refused at once, without waiting for (or making room for) the
// bytes claimed.
func huge(t *testing.T, h *hostileLab) {
	c := h.raw.dial()
	h.raw.send(c, header(wire.TypeHello, math.MaxUint32))
	refused(t, c, wire.CodeOK, 2*time.Second)

	// A Hello whose node name claims 65535 bytes of a 49-byte body.
	hello := frame(&wire.Hello{VersionMin: 1, VersionMax: 1, NodeName: "a", HostID: "hb", SlotSize: 1, Window: 1})
	binary.LittleEndian.PutUint16(hello[wire.HeaderSize+2:], math.MaxUint16)
	c = h.raw.dial()
	h.raw.send(c, hello)
	refused(t, c, wire.CodeOK, 2*time.Second)

	s := h.raw.handshake()
	h.raw.send(s.c, header(wire.TypeAck, math.MaxUint32))
	refused(t, s.c, wire.CodeMalformed, 2*time.Second)

	// An Ack claiming 2^32-1 chunk indices in a 12-byte body.
	s = h.raw.handshake()
	ack := frame(&wire.Ack{Transfer: 1})
	binary.LittleEndian.PutUint32(ack[wire.HeaderSize+8:], math.MaxUint32)
	h.raw.send(s.c, ack)
	refused(t, s.c, wire.CodeMalformed, 2*time.Second)

	// On a data stream: a chunk frame over MaxChunkBody, then a chunk
	// within it but over the receiver's slot size, meta only.
	s = h.raw.handshake()
	dc := h.raw.attach(s, 0)
	h.raw.send(dc, header(wire.TypeChunk, math.MaxUint32))
	refused(t, dc, wire.CodeOK, 2*time.Second)
	s = h.raw.handshake()
	dc = h.raw.attach(s, 0)
	big := &wire.Chunk{Transfer: 1, Count: 1, PayloadLen: 200 << 20, Segs: []wire.ChunkSeg{{Len: 200 << 20}}}
	h.raw.send(dc, wire.AppendChunkHead(nil, big, nil, false, 0))
	refused(t, dc, wire.CodeOK, 2*time.Second)
}

// truncated: frames cut short, then the connection half-closed: the
// sidecar must give up on them at once (not at a deadline) and land
// nothing of a chunk whose payload never came whole.
func truncated(t *testing.T, h *hostileLab) {
	tc := func(c net.Conn) {
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatalf("half-close: %v", err)
		}
	}
	hello := frame(&wire.Hello{VersionMin: 1, VersionMax: 1, NodeName: "a", HostID: "hb", SlotSize: 1, Window: 1})
	c := h.raw.dial()
	h.raw.send(c, hello[:wire.HeaderSize+20])
	tc(c)
	refused(t, c, wire.CodeOK, 2*time.Second)

	s := h.raw.hello(h.raw.dial())
	h.raw.send(s.c, frame(&wire.Auth{})[:wire.HeaderSize+10])
	tc(s.c)
	refused(t, s.c, wire.CodeOK, 2*time.Second)

	// A valid push into the victim whose only chunk stops halfway.
	s = h.raw.handshake()
	dc := h.raw.attach(s, 0)
	payload := bytes.Repeat([]byte{0x5A}, 64<<10)
	if n := h.announce(t, s, 1, uint64(len(payload)), victimBytes, h.victim.Region(0)); n != nil {
		t.Fatalf("a valid Announce was refused: %s %s", n.Code, n.Message)
	}
	whole := chunk(&wire.Chunk{Transfer: 1, Count: 1, Segs: []wire.ChunkSeg{{Len: uint32(len(payload)), Offset: 4096}}}, payload)
	h.raw.send(dc, whole[:len(whole)-len(payload)/2])
	tc(dc)
	refused(t, dc, wire.CodeOK, 2*time.Second)
	refused(t, s.c, wire.CodeOK, 3*time.Second)
}
