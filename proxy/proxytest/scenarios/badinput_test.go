package scenarios_test

import (
	"bytes"
	"context"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/device/hostmem"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// TestBadRequests: each bad request gets a clear error with the right code
// and changes nothing: the destination memory keeps its poison, the guard
// bytes hold, and both sidecars go back to idle.
func TestBadRequests(t *testing.T) {
	o := e2eOpts()
	o.Slots = 8
	pre, dec := proxytest.Pair(t, o)
	S, D := caches(t, pre, dec, 2, 1<<20)
	ctx := context.Background()
	good := func() client.Transfer {
		return kvsim.Transfer(route, wire.Push, "bad", S, D, kvsim.Ranges(S, 256<<10))
	}
	for _, tc := range []struct {
		name   string
		mutate func(*client.Transfer)
		code   wire.Code
		text   string
	}{
		{"unknown route", func(t *client.Transfer) { t.Route = "nowhere" }, wire.CodeUnknownRoute, `route "nowhere"`},
		{"unknown local region", func(t *client.Transfer) { t.LocalNames = []string{"nope/0", "nope/1"} }, wire.CodeUnknownRegion, `"nope/0"`},
		{"unknown remote region", func(t *client.Transfer) { t.RemoteNames = []string{"nope/0", "nope/1"} }, wire.CodeUnknownRegion, `"nope/0"`},
		{"local past the end", func(t *client.Transfer) { t.Ops[0].LocalOff = 1 << 20 }, wire.CodeOutOfRange, "past its end"},
		{"remote past the end", func(t *client.Transfer) { t.Ops[len(t.Ops)-1].RemoteOff = (1 << 20) - 1 }, wire.CodeOutOfRange, "region decode-kv/1"},
		{"local near 2^64", func(t *client.Transfer) { t.Ops[0].LocalOff = math.MaxUint64 - 10 }, wire.CodeOutOfRange, "overflows"},
		{"local at 2^64-1, length 1", func(t *client.Transfer) { t.Ops[0].LocalOff, t.Ops[0].Len = math.MaxUint64-1, 1 }, wire.CodeOutOfRange, "past its end"},
		{"remote near 2^64", func(t *client.Transfer) { t.Ops[0].RemoteOff = math.MaxUint64 - 10 }, wire.CodeOutOfRange, "overflows"},
		{"length near 2^64", func(t *client.Transfer) { t.Ops[0].Len = math.MaxUint64 }, wire.CodeOutOfRange, ""},
		{"no ops", func(t *client.Transfer) { t.Ops = nil }, wire.CodeBadRequest, "no ops"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := good()
			tc.mutate(&tr)
			_, err := pre.Client.Do(ctx, tr)
			if err == nil {
				t.Fatal("got success, want an error")
			}
			if got := client.CodeOf(err); got != tc.code {
				t.Errorf("got code %s (%v), want %s", got, err, tc.code)
			}
			if !strings.Contains(err.Error(), tc.text) {
				t.Errorf("error %q does not say %q", err, tc.text)
			}
			untouched(t, "the destination", D)
		})
	}
	// Pull side: reading past the end of the peer's region.
	tr := kvsim.Transfer(route, wire.Pull, "bad-pull", S, D, kvsim.Ranges(D, 256<<10))
	tr.Ops[0].RemoteOff = 1<<20 - 1
	if _, err := pre.Client.Do(ctx, tr); client.CodeOf(err) != wire.CodeOutOfRange {
		t.Errorf("pull past the peer's region: got %v, want out of range", err)
	}
	// Access rights: a region registered without remote write refuses pushes.
	ro, err := kvsim.New("ro", 1, 1<<20, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := ro.Poison(guard); err != nil {
		t.Fatal(err)
	}
	if err := ro.Register(ctx, dec.Client, wire.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	tr = kvsim.Transfer(route, wire.Push, "denied", S, ro, kvsim.Ranges(ro, 1<<20))
	tr.LocalNames = tr.LocalNames[:1]
	if _, err := pre.Client.Do(ctx, tr); client.CodeOf(err) != wire.CodeAccessDenied {
		t.Errorf("push into a read-only region: got %v, want access denied", err)
	}
	if err := ro.Unregister(ctx, dec.Client); err != nil {
		t.Fatal(err)
	}
	badRegistrations(t, pre.Client, S.Region(0))
}

// badRegistrations: registrations a sidecar must refuse fail with their
// code; so do an unregister and a status of what does not exist. taken
// is a region name cl registered already.
func badRegistrations(t *testing.T, cl *client.Client, taken string) {
	t.Helper()
	ctx := context.Background()
	mem, err := hostmem.NewShared("reg", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	fd := mem.FD()
	for _, tc := range []struct {
		name string
		r    client.Region
		code wire.Code
	}{
		{"duplicate name", client.Region{Name: taken, Handle: 1, Access: wire.AccessAll, AllocSize: 1 << 20, Length: 4096, FD: fd}, wire.CodeExists},
		{"past the allocation", client.Region{Name: "x", Handle: 1, Access: wire.AccessAll, AllocSize: 1 << 20, Offset: 1 << 20, Length: 1, FD: fd}, wire.CodeOutOfRange},
		{"offset near 2^64", client.Region{Name: "x", Handle: 1, Access: wire.AccessAll, AllocSize: 1 << 20, Offset: math.MaxUint64, Length: 2, FD: fd}, wire.CodeOutOfRange},
		{"claims more than the fd has", client.Region{Name: "x", Handle: 1, Access: wire.AccessAll, AllocSize: 1 << 30, Length: 4096, FD: fd}, wire.CodeDevice},
		{"memfd without its fd", client.Region{Name: "x", Handle: 1, Access: wire.AccessAll, AllocSize: 1 << 20, Length: 4096, FD: -1}, wire.CodeBadRequest},
		{"raw address", client.Region{Name: "x", Handle: 6, Access: wire.AccessAll, AllocSize: 4096, Length: 4096, FD: -1}, wire.CodeAccessDenied},
		{"cuda handle on hostmem", client.Region{Name: "x", Handle: 2, HandleRaw: make([]byte, 64), Access: wire.AccessAll, AllocSize: 4096, Length: 4096, FD: -1}, wire.CodeDevice},
		{"no access", client.Region{Name: "x", Handle: 1, Access: 0, AllocSize: 4096, Length: 4096, FD: fd}, wire.CodeBadRequest},
	} {
		t.Run("register "+tc.name, func(t *testing.T) {
			err := cl.Register(ctx, tc.r)
			if err == nil {
				t.Fatal("got success, want an error")
			}
			if got := client.CodeOf(err); got != tc.code {
				t.Errorf("got %s (%v), want %s", got, err, tc.code)
			}
		})
	}
	if err := cl.Unregister(ctx, "never-registered"); client.CodeOf(err) != wire.CodeUnknownRegion {
		t.Errorf("unregister unknown: got %v", err)
	}
	if _, err := cl.Status(ctx, 999999); client.CodeOf(err) != wire.CodeUnknownTransfer {
		t.Errorf("status of unknown transfer: got %v", err)
	}
}

// TestWrongToken: a peer with another token never gets a session, the
// route says why, and transfers on it fail with that reason.
func TestWrongToken(t *testing.T) {
	proxytest.NoLeaks(t)
	dec := proxytest.Start(t, "decode", "", proxytest.Options{Token: "right"})
	pre := proxytest.Start(t, "prefill", dec.PeerAddr(), proxytest.Options{Token: "wrong"})
	time.Sleep(300 * time.Millisecond)
	dec.ExpectIdle(t, 0)
	pre.ExpectIdle(t, 0)
	if st := dec.Snapshot(); st.Sessions != 0 {
		t.Fatalf("decode has %d sessions with a wrong-token peer", st.Sessions)
	}
	rs, err := pre.Client.Routes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Peers[0].State != "down" || !strings.Contains(rs[0].Peers[0].Error, "token") {
		t.Fatalf("routes say %+v, want the peer down because of the token", rs)
	}
	S := newCache(t, pre, "s", 1, 1<<20, 1)
	_, err = pre.Client.Do(context.Background(), kvsim.Transfer(route, wire.Push, "x", S, S, kvsim.Ranges(S, 1<<20)))
	if client.CodeOf(err) != wire.CodePeerUnavailable || !strings.Contains(err.Error(), "token") {
		t.Fatalf("got %v, want peer unavailable naming the token", err)
	}
}

// TestMalformedFrames: garbage on the control socket or the peer port is
// refused, the connection dropped, and the sidecar keeps serving.
func TestMalformedFrames(t *testing.T) {
	pre, dec := proxytest.Pair(t, e2eOpts())
	for _, tc := range []struct {
		name  string
		dial  func() (net.Conn, error)
		bytes []byte
	}{
		{"control socket garbage", func() (net.Conn, error) { return net.Dial("unix", pre.SocketPath()) }, []byte("GET / HTTP/1.1\r\n\r\n")},
		{"control socket huge length", func() (net.Conn, error) { return net.Dial("unix", pre.SocketPath()) },
			[]byte{'S', 'G', 1, byte(wire.TypeSubmit), 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0}},
		{"peer port garbage", func() (net.Conn, error) { return net.Dial("tcp", dec.PeerAddr()) }, bytes.Repeat([]byte{0xde, 0xad}, 64)},
		{"peer port chunk first", func() (net.Conn, error) { return net.Dial("tcp", dec.PeerAddr()) },
			[]byte{'S', 'G', 1, byte(wire.TypeChunk), 0, 0, 0, 0, 24, 0, 0, 0, 0, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.dial()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(tc.bytes); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(12 * time.Second))
			buf := make([]byte, 4096)
			for {
				if _, err := c.Read(buf); err != nil {
					break // closed by the sidecar: what we want
				}
			}
		})
	}
	// Still serving: a real transfer works.
	S, D := caches(t, pre, dec, 1, 1<<20)
	ms := kvsim.Ranges(S, 1<<20)
	run(t, pre.Client, wire.Push, "after-garbage", S, D, ms)
	if err := kvsim.Verify(S, D, ms, guard); err != nil {
		t.Fatal(err)
	}
}
