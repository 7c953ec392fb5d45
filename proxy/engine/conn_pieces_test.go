package engine

import (
	"net"
	"testing"
	"time"

	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// servePieces is serve whose backend reports what its Growers are given.
func servePieces(t *testing.T) (path string, grows chan string, finish func()) {
	t.Helper()
	grows = make(chan string, 64)
	_, path, finish = serveBackend(t, 4, grows)
	return path, grows, finish
}

func ops(lens ...uint64) []wire.LocalOp {
	out := make([]wire.LocalOp, len(lens))
	for i, n := range lens {
		out[i] = wire.LocalOp{Len: n}
	}
	return out
}

func head(req uint64, route string, n int) *wire.SubmitHead {
	return &wire.SubmitHead{Submit: wire.Submit{Req: req, Route: route, Dir: wire.Push, LocalNames: []string{"a"}, RemoteNames: []string{"b"},
		Ops: ops(ones(n)...)}, Total: 1 << 20, Ends: []uint64{1 << 20}}
}

func ones(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

// expectGrows reads want from grows, then checks nothing more comes soon.
func expectGrows(t *testing.T, grows chan string, want ...string) {
	t.Helper()
	for _, w := range want {
		select {
		case g := <-grows:
			if g != w {
				t.Fatalf("grower got %q, want %q", g, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("grower got nothing, want %q", w)
		}
	}
	select {
	case g := <-grows:
		t.Fatalf("grower got %q after %q", g, want)
	case <-time.After(30 * time.Millisecond):
	}
}

func write(t *testing.T, c *net.UnixConn, ms ...wire.Msg) {
	t.Helper()
	for _, m := range ms {
		if err := unixsock.WriteFrame(c, m, -1); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPiecesInOrder(t *testing.T) {
	path, grows, _ := servePieces(t)
	c := dial(t, path)
	write(t, c, head(1, "", 2), &wire.SubmitMore{Req: 1, Ops: ops(1)}, &wire.SubmitMore{Req: 1, End: true, Ops: ops(1, 2)})
	if m, ok := readMsg(t, c).(*wire.Submitted); !ok || m.Req != 1 || m.Transfer != 7 {
		t.Fatalf("SubmitHead answered %#v, want Submitted", m)
	}
	expectGrows(t, grows, "head 2", "grow 1 false", "grow 2 true")
	// The request is closed: a piece more is a stray, answered Fail.
	write(t, c, &wire.SubmitMore{Req: 1, End: true, Ops: ops(1)})
	if m, ok := readMsg(t, c).(*wire.Fail); !ok || m.Req != 1 || m.Code != wire.CodeBadRequest {
		t.Fatalf("a piece after End answered %#v, want Fail BadRequest", m)
	}
}

// Pieces that come while the head waits for its peer are kept, and given
// in order once it is admitted.
func TestPiecesWhileHeadWaits(t *testing.T) {
	path, grows, finish := servePieces(t)
	c := dial(t, path)
	write(t, c, head(1, "slow", 1), &wire.SubmitMore{Req: 1, Ops: ops(1, 1)}, &wire.SubmitMore{Req: 1, End: true, Ops: ops(3)},
		&wire.Status{Req: 2, Transfer: 7})
	if m, ok := readMsg(t, c).(*wire.XferStatus); !ok || m.Req != 2 {
		t.Fatalf("got %#v, want the Status answered while the head waits", m)
	}
	expectGrows(t, grows)
	finish()
	if m, ok := readMsg(t, c).(*wire.Submitted); !ok || m.Req != 1 {
		t.Fatalf("SubmitHead answered %#v, want Submitted", m)
	}
	expectGrows(t, grows, "head 1", "grow 2 false", "grow 1 true")
}

// A piece the transfer refuses fails it; the rest of its pieces are
// dropped unanswered, and its End closes it.
func TestPiecesBadPiece(t *testing.T) {
	path, grows, _ := servePieces(t)
	c := dial(t, path)
	write(t, c, &wire.SubmitHead{Submit: head(1, "", 1).Submit, Wait: true, Total: 1 << 20, Ends: []uint64{1 << 20}},
		&wire.SubmitMore{Req: 1, Ops: ops(13)}, &wire.SubmitMore{Req: 1, Ops: ops(1)}, &wire.SubmitMore{Req: 1, End: true, Ops: ops(1)},
		&wire.SubmitMore{Req: 1, Ops: ops(1)})
	expectGrows(t, grows, "head 1", "grow refused")
	if m, ok := readMsg(t, c).(*wire.Fail); !ok || m.Req != 1 || m.Code != wire.CodeBadRequest {
		t.Fatalf("a piece after the End of a failed request answered %#v, want Fail BadRequest (a stray)", m)
	}
}

// A request whose End does not come in time is aborted (Timeout); one
// open when the connection closes is aborted (Cancelled).
func TestPiecesMissingEnd(t *testing.T) {
	old := wireLimits
	wireLimits.rest = 100 * time.Millisecond
	t.Cleanup(func() { wireLimits = old })
	path, grows, _ := servePieces(t)
	c := dial(t, path)
	write(t, c, head(1, "", 1), &wire.SubmitMore{Req: 1, Ops: ops(1)})
	if m, ok := readMsg(t, c).(*wire.Submitted); !ok || m.Req != 1 {
		t.Fatalf("SubmitHead answered %#v", m)
	}
	expectGrows(t, grows, "head 1", "grow 1 false")
	time.Sleep(150 * time.Millisecond)
	expectGrows(t, grows, "abort timeout")
	write(t, c, &wire.SubmitMore{Req: 1, End: true, Ops: ops(1)})
	if m, ok := readMsg(t, c).(*wire.Fail); !ok || m.Req != 1 || m.Code != wire.CodeBadRequest {
		t.Fatalf("the End after the deadline answered %#v, want Fail BadRequest", m)
	}
	write(t, c, head(2, "", 1))
	readMsg(t, c)
	expectGrows(t, grows, "head 1")
	_ = c.Close()
	expectGrows(t, grows, "abort cancelled")
}

func TestPiecesStray(t *testing.T) {
	path, _, _ := servePieces(t)
	c := dial(t, path)
	write(t, c, &wire.SubmitMore{Req: 9, Ops: ops(1)})
	if m, ok := readMsg(t, c).(*wire.Fail); !ok || m.Req != 9 || m.Code != wire.CodeBadRequest {
		t.Fatalf("a SubmitMore without a head answered %#v, want Fail BadRequest", m)
	}
	write(t, c, head(3, "", 1), head(3, "", 1))
	readMsg(t, c) // Submitted
	if m, ok := readMsg(t, c).(*wire.Fail); !ok || m.Req != 3 || m.Code != wire.CodeBadRequest {
		t.Fatalf("a second head with an open Req answered %#v, want Fail BadRequest", m)
	}
}

// A SubmitMore that does not decode is answered Fail with its Req and
// fails its open request at once; its later pieces are dropped.
func TestPiecesUndecodable(t *testing.T) {
	path, grows, _ := servePieces(t)
	c := dial(t, path)
	write(t, c, head(1, "", 1))
	readMsg(t, c) // Submitted
	bad := wire.AppendFrame(nil, &wire.SubmitMore{Req: 1, Ops: ops(1)}, false, 0)
	bad[wire.HeaderSize+8] = 2 // End neither 0 nor 1
	if _, err := c.Write(bad); err != nil {
		t.Fatal(err)
	}
	if m, ok := readMsg(t, c).(*wire.Fail); !ok || m.Req != 1 || m.Code != wire.CodeMalformed {
		t.Fatalf("an undecodable piece answered %#v, want Fail Malformed", m)
	}
	expectGrows(t, grows, "head 1", "abort malformed")
	write(t, c, &wire.SubmitMore{Req: 1, End: true, Ops: ops(1)}, &wire.Status{Req: 2, Transfer: 7})
	if m, ok := readMsg(t, c).(*wire.XferStatus); !ok || m.Req != 2 {
		t.Fatalf("got %#v, want the End dropped and the Status answered", m)
	}
	expectGrows(t, grows)
}
