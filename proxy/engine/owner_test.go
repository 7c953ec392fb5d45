package engine

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// token is a group token long enough to be accepted.
const token = "0123456789abcdef-group"

// serveOwners runs a listener whose backend reports the owner of every
// Register and Closed.
func serveOwners(t *testing.T) (l *Listener, path string, regs, closed chan Owner) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "s", "c.sock")
	done := make(chan struct{})
	regs, closed = make(chan Owner, 16), make(chan Owner, 16)
	l, err := Listen(path, fakeBackend{done: done, regs: regs, closed: closed}, zap.NewNop(), Options{MaxClients: 8})
	if err != nil {
		t.Fatal(err)
	}
	l.Serve()
	t.Cleanup(func() { close(done); l.Close() })
	return l, path, regs, closed
}

// ask writes m on c and returns the answer.
func ask(t *testing.T, c *net.UnixConn, m wire.Msg) wire.Msg {
	t.Helper()
	if err := unixsock.WriteFrame(c, m, -1); err != nil {
		t.Fatal(err)
	}
	return readMsg(t, c)
}

func wantFail(t *testing.T, what string, m wire.Msg, code wire.Code, text string) {
	t.Helper()
	f, ok := m.(*wire.Fail)
	if !ok || f.Code != code || !strings.Contains(f.Message, text) {
		t.Fatalf("%s: got %#v, want Fail %v mentioning %q", what, m, code, text)
	}
}

func ownerOf(t *testing.T, ch chan Owner) Owner {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(5 * time.Second):
		t.Fatal("the backend heard of no owner")
		return Owner{}
	}
}

// TestOwners: each connection is its own group until it joins one; two
// that joined one token share it; Join comes first or not at all, with a
// token long enough; Closed hears of each connection once it ended.
func TestOwners(t *testing.T) {
	_, path, regs, closed := serveOwners(t)
	a, b, c := dial(t, path), dial(t, path), dial(t, path)
	ask(t, a, &wire.Register{Req: 1, Name: "x"})
	ask(t, b, &wire.Register{Req: 1, Name: "y"})
	oa, ob := ownerOf(t, regs), ownerOf(t, regs)
	if oa.Conn == ob.Conn || oa.Group == ob.Group || !strings.HasPrefix(oa.Group, "c:") {
		t.Fatalf("two plain connections: got owners %+v and %+v, want two groups of their own", oa, ob)
	}
	wantFail(t, "Join after Register", ask(t, a, &wire.Join{Req: 2, Group: []byte(token)}), wire.CodeBadRequest, "first request")
	wantFail(t, "short token", ask(t, c, &wire.Join{Req: 1, Group: []byte("short")}), wire.CodeBadRequest, "at least 16")
	d := dial(t, path)
	for _, cn := range []*net.UnixConn{c, d} {
		if m, ok := ask(t, cn, &wire.Join{Req: 2, Group: []byte(token)}).(*wire.OK); !ok || m.Req != 2 {
			t.Fatalf("Join: got %#v, want OK", m)
		}
		ask(t, cn, &wire.Register{Req: 3, Name: "z"})
	}
	oc, od := ownerOf(t, regs), ownerOf(t, regs)
	if oc.Group != "g:"+token || od.Group != oc.Group || oc.Conn == od.Conn {
		t.Fatalf("two joined connections: got %+v and %+v, want one group g:%s", oc, od, token)
	}
	wantFail(t, "second Join", ask(t, c, &wire.Join{Req: 4, Group: []byte(token)}), wire.CodeBadRequest, "first request")
	_ = a.Close()
	if o := ownerOf(t, closed); o != oa {
		t.Fatalf("Closed: got %+v, want %+v", o, oa)
	}
}

// TestNotifyGroups: a Notify reaches the subscribers of the groups it
// names, and nobody else.
func TestNotifyGroups(t *testing.T) {
	l, path, _, _ := serveOwners(t)
	in, out := dial(t, path), dial(t, path)
	ask(t, in, &wire.Join{Req: 1, Group: []byte(token)})
	for _, c := range []*net.UnixConn{in, out} {
		if m, ok := ask(t, c, &wire.Subscribe{Req: 2}).(*wire.OK); !ok {
			t.Fatalf("Subscribe: got %#v", m)
		}
	}
	l.Notify(&wire.Notify{Transfer: 9, Dir: wire.Push}, []string{"g:" + token})
	if m, ok := readMsg(t, in).(*wire.Notify); !ok || m.Transfer != 9 {
		t.Fatalf("the group's subscriber: got %#v, want Notify 9", m)
	}
	_ = out.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, m, _, _, err := unixsock.ReadFrame(out, nil); err == nil {
		t.Fatalf("another group's subscriber got %#v, want nothing", m)
	}
}
