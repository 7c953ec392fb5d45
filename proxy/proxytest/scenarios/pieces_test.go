package scenarios_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// TestPiecesInOrder: a client that sends large transfers in pieces moves
// them byte-exact: a push over TCP (started on its first piece), a pull,
// and a push between sidecars of one node (both collected and started at
// End); a SubmitWait in pieces is answered once done.
func TestPiecesInOrder(t *testing.T) {
	for _, tc := range []struct {
		name string
		dir  wire.Direction
		node bool
	}{
		{"push tcp", wire.Push, false},
		{"pull tcp", wire.Pull, false},
		{"push one node", wire.Push, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := e2eOpts()
			if tc.node {
				o = oneNode(t)
			}
			pre, dec := proxytest.Pair(t, o)
			cl := pre.Dial(t, client.WithPieces(64, 16, 100))
			var S, D *kvsim.Cache
			if tc.dir == wire.Push {
				S, D = caches(t, pre, dec, 2, 4<<20)
			} else {
				S, D = caches(t, dec, pre, 2, 4<<20)
			}
			ms := kvsim.Blocks(S, 16<<10, 3) // 512 ops
			local, remote := S, D
			if tc.dir == wire.Pull {
				local, remote = D, S
			}
			ctx := context.Background()
			st, err := cl.Do(ctx, kvsim.Transfer(route, tc.dir, "pieces", local, remote, ms))
			if err != nil {
				t.Fatalf("Do in pieces: %v", err)
			}
			if st.State != wire.StateDone || st.Total != 8<<20 {
				t.Fatalf("status %+v, want done, 8 MiB", st)
			}
			if err := kvsim.Verify(S, D, ms, guard); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// rawConn is a control connection that writes frames as the test says,
// joined to sc's group.
type rawConn struct {
	t   *testing.T
	c   *net.UnixConn
	buf []byte
}

func dialRaw(t *testing.T, sc *proxytest.Sidecar) *rawConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sc.SocketPath(), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	r := &rawConn{t: t, c: c}
	r.write(&wire.Join{Req: 1 << 60, Group: sc.Group})
	if _, ok := r.read().(*wire.OK); !ok {
		t.Fatal("Join refused")
	}
	return r
}

func (r *rawConn) write(ms ...wire.Msg) {
	r.t.Helper()
	for _, m := range ms {
		if _, err := r.c.Write(wire.AppendFrame(nil, m, false, 0)); err != nil {
			r.t.Fatal(err)
		}
	}
}

func (r *rawConn) read() wire.Msg {
	r.t.Helper()
	var m wire.Msg
	var err error
	_, m, r.buf, err = wire.ReadFrame(r.c, r.buf)
	if err != nil {
		r.t.Fatalf("read an answer: %v", err)
	}
	return m
}

// piecesHead is the SubmitHead of a push of ms from S to D, carrying the
// first n ops; Total and Ends cover all of ms.
func piecesHead(req uint64, S, D *kvsim.Cache, ms []kvsim.Move, n int, wait bool) (*wire.SubmitHead, []wire.LocalOp) {
	tr := kvsim.Transfer(route, wire.Push, "raw", S, D, ms)
	h := &wire.SubmitHead{Submit: wire.Submit{Req: req, Route: tr.Route, Dir: tr.Dir, Tag: tr.Tag, LocalNames: tr.LocalNames,
		RemoteNames: tr.RemoteNames, Ops: tr.Ops[:n]}, Wait: wait, Ends: make([]uint64, len(tr.RemoteNames))}
	for _, op := range tr.Ops {
		h.Total += op.Len
		h.Ends[op.Remote] = max(h.Ends[op.Remote], op.RemoteOff+op.Len)
	}
	return h, tr.Ops[n:]
}

// TestPiecesStartBeforeEnd: the chunks of a push's first piece move (the
// receiver acks bytes) before its other pieces are sent; the rest then
// completes it byte-exact.
func TestPiecesStartBeforeEnd(t *testing.T) {
	pre, dec := proxytest.Pair(t, e2eOpts())
	S, D := caches(t, pre, dec, 1, 4<<20)
	ms := kvsim.Blocks(S, 16<<10, 5) // 256 ops; 1 MiB slots: the first 128 ops fill 2 chunks
	r := dialRaw(t, pre)
	h, rest := piecesHead(1, S, D, ms, 128, false)
	r.write(h)
	sub, ok := r.read().(*wire.Submitted)
	if !ok {
		t.Fatal("SubmitHead not answered Submitted")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.write(&wire.Status{Req: 2, Transfer: sub.Transfer})
		st := r.read().(*wire.XferStatus)
		if st.Done >= 2<<20 {
			break
		}
		if st.State == wire.StateFailed || time.Now().After(deadline) {
			t.Fatalf("the first piece's chunks did not move before the rest came: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.write(&wire.SubmitMore{Req: 1, Ops: rest[:64]}, &wire.SubmitMore{Req: 1, End: true, Ops: rest[64:]},
		&wire.Wait{Req: 3, Transfer: sub.Transfer})
	if st := r.read().(*wire.XferStatus); st.State != wire.StateDone {
		t.Fatalf("after End: %+v, want done", st)
	}
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
}

// TestPiecesRefused: a request whose pieces break its head's word fails
// whole with a code that says why (a piece past the declared Ends, ops
// adding up to less than Total, a piece for no open request, an End that
// never comes), and the sidecars keep nothing of it: their slots and
// transfers go back to idle (the pair's cleanup checks), the next
// transfer moves.
func TestPiecesRefused(t *testing.T) {
	pre, dec := proxytest.Pair(t, e2eOpts())
	S, D := caches(t, pre, dec, 1, 4<<20)
	ms := kvsim.Blocks(S, 16<<10, 6)
	for _, tc := range []struct {
		name  string
		tweak func(h *wire.SubmitHead, rest []wire.LocalOp) []wire.Msg // the pieces after h
		code  wire.Code
		msg   string
	}{
		{"past declared end", func(h *wire.SubmitHead, rest []wire.LocalOp) []wire.Msg {
			bad := append([]wire.LocalOp(nil), rest...)
			bad[3].RemoteOff = h.Ends[0] - 1
			return []wire.Msg{&wire.SubmitMore{Req: h.Req, Ops: bad[:64]}, &wire.SubmitMore{Req: h.Req, End: true, Ops: bad[64:]}}
		}, wire.CodeOutOfRange, "declared"},
		{"short of total", func(h *wire.SubmitHead, rest []wire.LocalOp) []wire.Msg {
			return []wire.Msg{&wire.SubmitMore{Req: h.Req, End: true, Ops: rest[1:]}}
		}, wire.CodeBadRequest, "add up to"},
		{"past its local region", func(h *wire.SubmitHead, rest []wire.LocalOp) []wire.Msg {
			bad := append([]wire.LocalOp(nil), rest...)
			bad[0].LocalOff = 1 << 40
			return []wire.Msg{&wire.SubmitMore{Req: h.Req, End: true, Ops: bad}}
		}, wire.CodeOutOfRange, "op 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dialRaw(t, pre)
			h, rest := piecesHead(7, S, D, ms, 128, true)
			r.write(h)
			r.write(tc.tweak(h, rest)...)
			st, ok := r.read().(*wire.XferStatus)
			if !ok || st.Req != 7 || st.State != wire.StateFailed || st.Code != tc.code || !strings.Contains(st.Message, tc.msg) {
				t.Fatalf("got %#v, want a failed status, code %s, naming %q", st, tc.code, tc.msg)
			}
		})
	}
	t.Run("stray piece", func(t *testing.T) {
		r := dialRaw(t, pre)
		r.write(&wire.SubmitMore{Req: 9, End: true, Ops: []wire.LocalOp{{Len: 1}}})
		if f, ok := r.read().(*wire.Fail); !ok || f.Req != 9 || f.Code != wire.CodeBadRequest {
			t.Fatalf("got %#v, want Fail BadRequest for request 9", f)
		}
	})
	t.Run("missing end", func(t *testing.T) {
		if testing.Short() {
			t.Skip("waits out the 10 s a request has for its End")
		}
		r := dialRaw(t, pre)
		h, _ := piecesHead(8, S, D, ms, 128, true)
		r.write(h)
		start := time.Now()
		st, ok := r.read().(*wire.XferStatus)
		if !ok || st.State != wire.StateFailed || st.Code != wire.CodeTimeout || !strings.Contains(st.Message, "End did not come") {
			t.Fatalf("got %#v, want a failed status, code Timeout", st)
		}
		if el := time.Since(start); el < wire.SubmitRestMs*time.Millisecond-time.Second {
			t.Fatalf("failed after %v, before the request's time was up", el)
		}
	})
	// The pair still moves a transfer in pieces.
	if _, err := pre.Dial(t, client.WithPieces(64, 16, 100)).Do(context.Background(), kvsim.Transfer(route, wire.Push, "after", S, D, ms)); err != nil {
		t.Fatal(err)
	}
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
}

// TestPiecesCollectingEnds: a pull in pieces (collected until its End) that
// is cancelled, or whose region is unregistered, before its End fails and
// lets go of its regions (a confirmed unregister of them then returns at
// once); its End changes nothing.
func TestPiecesCollectingEnds(t *testing.T) {
	pre, dec := proxytest.Pair(t, e2eOpts())
	S := cacheOn(t, dec, "src", 5)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		end  func(r *rawConn, D *kvsim.Cache, id uint64)
		code wire.Code
	}{
		{"cancelled", func(r *rawConn, _ *kvsim.Cache, id uint64) {
			r.write(&wire.Cancel{Req: 2, Transfer: id})
			if _, ok := r.read().(*wire.OK); !ok {
				t.Fatal("Cancel refused")
			}
		}, wire.CodeCancelled},
		{"unregistered", func(r *rawConn, D *kvsim.Cache, _ uint64) {
			r.write(&wire.Unregister{Req: 2, Name: D.Regions()[0]})
			if _, ok := r.read().(*wire.OK); !ok {
				t.Fatal("Unregister refused")
			}
		}, wire.CodeUnknownRegion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			D := newCache(t, pre, "dst-"+tc.name, 2, 256<<10, 0)
			ms := kvsim.Blocks(S, 16<<10, 8)
			tr := kvsim.Transfer(route, wire.Pull, "collect", D, S, ms)
			h := &wire.SubmitHead{Submit: wire.Submit{Req: 1, Route: tr.Route, Dir: wire.Pull, LocalNames: tr.LocalNames, RemoteNames: tr.RemoteNames,
				Ops: tr.Ops[:8]}, Ends: make([]uint64, len(tr.RemoteNames))}
			for _, op := range tr.Ops {
				h.Total += op.Len
				h.Ends[op.Remote] = max(h.Ends[op.Remote], op.RemoteOff+op.Len)
			}
			r := dialRaw(t, pre)
			r.write(h)
			sub, ok := r.read().(*wire.Submitted)
			if !ok {
				t.Fatal("SubmitHead not answered Submitted")
			}
			tc.end(r, D, sub.Transfer)
			r.write(&wire.SubmitMore{Req: 1, End: true, Ops: tr.Ops[8:]}, &wire.Wait{Req: 3, Transfer: sub.Transfer})
			st, ok := r.read().(*wire.XferStatus)
			if !ok || st.State != wire.StateFailed || st.Code != tc.code {
				t.Fatalf("got %#v, want failed with %s", st, tc.code)
			}
			// Nothing holds the regions: a confirmed unregister returns at once.
			start := time.Now()
			for _, name := range D.Regions() {
				err := pre.Client.UnregisterWait(ctx, name, 5*time.Second)
				if err != nil && client.CodeOf(err) != wire.CodeUnknownRegion {
					t.Fatalf("unregister %s: %v", name, err)
				}
			}
			if el := time.Since(start); el > time.Second {
				t.Fatalf("the regions were held %v after the transfer ended", el)
			}
			untouched(t, "the destination", D)
		})
	}
}
