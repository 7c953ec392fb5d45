package engine

import (
	"fmt"
	"math"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeBackend answers from a table: region "bad" is refused, transfer 7
// exists and finishes when done is closed, and so does the transfer that
// holds region "held".
// Register and Closed report their owner on regs and closed, when set.
type fakeBackend struct {
	done         chan struct{}
	regs, closed chan Owner
	grows        chan string // what SubmitHead's Grower was given, when set
}

type fakeXfer struct{ done chan struct{} }

func (x fakeXfer) ID() uint64 { return 7 }
func (x fakeXfer) Status(req uint64) *wire.XferStatus {
	st := &wire.XferStatus{Req: req, Transfer: 7, State: wire.StateRunning}
	select {
	case <-x.done:
		st.State = wire.StateDone
	default:
	}
	return st
}
func (x fakeXfer) Done() <-chan struct{} { return x.done }
func (x fakeXfer) WhenDone(f func()) {
	go func() { <-x.done; f() }()
}

func (b fakeBackend) Register(o Owner, m *wire.Register, fd int) error {
	if b.regs != nil {
		b.regs <- o
	}
	if m.Name == "bad" {
		return status.Errorf(wire.CodeExists, "region %q is already registered", m.Name)
	}
	return nil
}
func (b fakeBackend) RegisterKV(Owner, *wire.RegisterKV) error { return nil }
func (b fakeBackend) Grant(Owner, *wire.Grant) error           { return nil }
func (b fakeBackend) Unregister(Owner, string) error           { return nil }

// heldKey is the transfer key whose RevokeGrant waits.
var heldKey = []byte("held-key-0123456")

// RevokeGrant of heldKey waits, as for a peer transfer still under way
// under it, until done is closed.
func (b fakeBackend) RevokeGrant(_ Owner, m *wire.RevokeGrant) error {
	if string(m.Key) == string(heldKey) {
		<-b.done
	}
	return nil
}
func (b fakeBackend) Closed(o Owner) {
	if b.closed != nil {
		b.closed <- o
	}
}
func (b fakeBackend) UnregisterWait(_ Owner, name string, wait time.Duration, cancel <-chan struct{}) error {
	if name != "held" {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-b.done:
		return nil
	case <-t.C:
		return status.Errorf(wire.CodeBusy, "region %q: 1 transfer(s) still use it after %v", name, wait)
	case <-cancel:
		return status.Errorf(wire.CodeCancelled, "region %q: given up", name)
	}
}
func (b fakeBackend) Submit(_ Owner, m *wire.Submit, wait bool) (Transfer, error) {
	if m.Route == "slow" { // waits for its peer until done is closed
		if !wait {
			return nil, ErrWouldWait
		}
		<-b.done
	}
	return fakeXfer{b.done}, nil
}
func (b fakeBackend) SubmitKV(Owner, *wire.SubmitKV) (Transfer, error) { return fakeXfer{b.done}, nil }
func (b fakeBackend) SubmitHead(_ Owner, m *wire.SubmitHead, wait bool) (Transfer, Grower, error) {
	x, err := b.Submit(Owner{}, &m.Submit, wait)
	if err != nil {
		return nil, nil, err
	}
	g := &fakeGrower{b: b}
	g.note("head %d", len(m.Ops))
	return x, g, nil
}

// fakeGrower reports what it was given on b.grows, when set.
type fakeGrower struct{ b fakeBackend }

func (g *fakeGrower) note(format string, args ...any) {
	if g.b.grows != nil {
		g.b.grows <- fmt.Sprintf(format, args...)
	}
}
func (g *fakeGrower) Grow(ops []wire.LocalOp, end bool) error {
	if len(ops) > 0 && ops[0].Len == 13 { // the transfer fails on it
		g.note("grow refused")
		return status.Errorf(wire.CodeOutOfRange, "13 bytes")
	}
	g.note("grow %d %v", len(ops), end)
	return nil
}
func (g *fakeGrower) Abort(err error) { g.note("abort %s", status.Code(err)) }
func (b fakeBackend) Lookup(_ Owner, id uint64) (Transfer, error) {
	if id != 7 {
		return nil, status.Errorf(wire.CodeUnknownTransfer, "transfer %d is unknown", id)
	}
	return fakeXfer{b.done}, nil
}
func (b fakeBackend) Cancel(Owner, uint64) error               { return nil }
func (b fakeBackend) Query(Owner, *wire.Query) ([]byte, error) { return []byte(`{}`), nil }
func (b fakeBackend) OpenInbox(Owner, *wire.OpenInbox) error   { return nil }
func (b fakeBackend) PostTicket(Owner, *wire.PostTicket) error { return nil }
func (b fakeBackend) TakeTickets(_ Owner, m *wire.TakeTickets, cancel <-chan struct{}) []wire.TicketItem {
	if m.WaitMs > 0 { // nothing comes: wait until the connection ends
		<-cancel
	}
	return nil
}

// serve runs a listener on a fake backend; finish ends its transfer.
func serve(t *testing.T, max int) (l *Listener, path string, finish func()) {
	t.Helper()
	return serveBackend(t, max, nil)
}

// serveBackend is serve with a backend that reports on grows what its
// Growers are given (nil: nothing reported).
func serveBackend(t *testing.T, max int, grows chan string) (l *Listener, path string, finish func()) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "s", "c.sock")
	done := make(chan struct{})
	l, err := Listen(path, fakeBackend{done: done, grows: grows}, zap.NewNop(), Options{MaxClients: max})
	if err != nil {
		t.Fatal(err)
	}
	l.Serve()
	var once sync.Once
	finish = func() { once.Do(func() { close(done) }) }
	t.Cleanup(func() { finish(); l.Close() })
	return l, path, finish
}

// readMsg reads the next frame the listener sent on c.
func readMsg(t *testing.T, c *net.UnixConn) wire.Msg {
	t.Helper()
	_, m, fd, _, err := unixsock.ReadFrame(c, nil)
	unixsock.CloseFD(fd)
	if err != nil {
		t.Fatalf("read an answer: %v (a request not answered, or answered only behind one that waits?)", err)
	}
	return m
}

func dial(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	return c
}

func TestRequests(t *testing.T) {
	_, path, _ := serve(t, 4)
	c := dial(t, path)
	for _, tc := range []struct {
		name string
		req  wire.Msg
		want wire.Msg
	}{
		{"register", &wire.Register{Req: 1, Name: "a"}, &wire.OK{Req: 1}},
		{"register refused", &wire.Register{Req: 2, Name: "bad"}, &wire.Fail{Req: 2, Code: wire.CodeExists, Message: `region "bad" is already registered`}},
		{"submit", &wire.Submit{Req: 3, Dir: wire.Push}, &wire.Submitted{Req: 3, Transfer: 7}},
		{"status", &wire.Status{Req: 4, Transfer: 7}, &wire.XferStatus{Req: 4, Transfer: 7, State: wire.StateRunning}},
		{"status of unknown", &wire.Status{Req: 5, Transfer: 8}, &wire.Fail{Req: 5, Code: wire.CodeUnknownTransfer, Message: "transfer 8 is unknown"}},
		{"not a request", &wire.OK{Req: 6}, &wire.Fail{Req: 6, Code: wire.CodeBadRequest, Message: "OK is not a request"}},
	} {
		if err := unixsock.WriteFrame(c, tc.req, -1); err != nil {
			t.Fatal(err)
		}
		_, got, fd, _, err := unixsock.ReadFrame(c, nil)
		unixsock.CloseFD(fd)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if g, w := wire.AppendFrame(nil, got, false, 0), wire.AppendFrame(nil, tc.want, false, 0); string(g) != string(w) {
			t.Errorf("%s: got %#v, want %#v", tc.name, got, tc.want)
		}
	}
}

// A subscriber hears of transfers; SubmitWait is answered when its
// transfer finishes, not before.
func TestNotifyAndSubmitWait(t *testing.T) {
	l, path, finish := serve(t, 4)
	c := dial(t, path)
	if err := unixsock.WriteFrame(c, &wire.Join{Req: 3, Group: []byte(token)}, -1); err != nil {
		t.Fatal(err)
	}
	if m, ok := readMsg(t, c).(*wire.OK); !ok || m.Req != 3 {
		t.Fatalf("Join answered %#v", m)
	}
	if err := unixsock.WriteFrame(c, &wire.Subscribe{Req: 1}, -1); err != nil {
		t.Fatal(err)
	}
	if err := unixsock.WriteFrame(c, &wire.SubmitWait{Submit: wire.Submit{Req: 2, Dir: wire.Push}}, -1); err != nil {
		t.Fatal(err)
	}
	if m, ok := readMsg(t, c).(*wire.OK); !ok || m.Req != 1 {
		t.Fatalf("Subscribe answered %#v", m)
	}
	time.Sleep(50 * time.Millisecond) // the SubmitWait is in; nothing may answer it yet
	l.Notify(&wire.Notify{Transfer: 9, Tag: "t", Dir: wire.Push}, []string{"g:" + token})
	if m, ok := readMsg(t, c).(*wire.Notify); !ok || m.Transfer != 9 {
		t.Fatalf("got %#v, want the Notify first: SubmitWait answered before its transfer finished", m)
	}
	finish()
	if m, ok := readMsg(t, c).(*wire.XferStatus); !ok || m.Req != 2 || m.State != wire.StateDone {
		t.Fatalf("SubmitWait answered %#v, want a done XferStatus", m)
	}
}

// A submit that waits for its peer is answered aside: the client's next
// request is answered first, and the submit once its wait ends.
func TestWaitingSubmitAside(t *testing.T) {
	_, path, finish := serve(t, 4)
	c := dial(t, path)
	for _, m := range []wire.Msg{&wire.Submit{Req: 1, Route: "slow", Dir: wire.Push}, &wire.Status{Req: 2, Transfer: 7}} {
		if err := unixsock.WriteFrame(c, m, -1); err != nil {
			t.Fatal(err)
		}
	}
	if m, ok := readMsg(t, c).(*wire.XferStatus); !ok || m.Req != 2 {
		t.Fatalf("got %#v first, want the Status answered while the submit waits", m)
	}
	finish()
	if m, ok := readMsg(t, c).(*wire.Submitted); !ok || m.Req != 1 || m.Transfer != 7 {
		t.Fatalf("the waiting submit was answered %#v, want Submitted", m)
	}
}

// A confirmed unregister is answered aside, once the region's transfer
// ended; one that waits too long is refused busy.
func TestUnregisterWaitAside(t *testing.T) {
	_, path, finish := serve(t, 4)
	c := dial(t, path)
	for _, m := range []wire.Msg{&wire.Unregister{Req: 1, Name: "held", WaitMs: 20}, &wire.Unregister{Req: 2, Name: "held", WaitMs: 60000},
		&wire.Status{Req: 3, Transfer: 7}} {
		if err := unixsock.WriteFrame(c, m, -1); err != nil {
			t.Fatal(err)
		}
	}
	if m, ok := readMsg(t, c).(*wire.XferStatus); !ok || m.Req != 3 {
		t.Fatalf("got %#v first, want the Status answered while the Unregisters wait", m)
	}
	if m, ok := readMsg(t, c).(*wire.Fail); !ok || m.Req != 1 || m.Code != wire.CodeBusy {
		t.Fatalf("the Unregister waiting 20 ms was answered %#v, want Fail busy", m)
	}
	finish()
	if m, ok := readMsg(t, c).(*wire.OK); !ok || m.Req != 2 {
		t.Fatalf("the Unregister waiting a minute was answered %#v, want OK once the transfer ended", m)
	}
}

// A RevokeGrant that waits for the transfers admitted under its key is
// answered aside: the engine's grants for other requests (and its other
// calls) go on meanwhile.
func TestRevokeGrantAside(t *testing.T) {
	_, path, finish := serve(t, 4)
	c := dial(t, path)
	for _, m := range []wire.Msg{&wire.RevokeGrant{Req: 1, Cache: "kv", Key: heldKey},
		&wire.Grant{Req: 2, Cache: "kv", Key: []byte("next-key-0123456"), TTLMs: 1000, Uses: 1, Blocks: []uint32{1}}} {
		if err := unixsock.WriteFrame(c, m, -1); err != nil {
			t.Fatal(err)
		}
	}
	if m := readMsg(t, c); m.Type() != wire.TypeOK || m.(*wire.OK).Req != 2 {
		t.Fatalf("got %#v first, want the Grant answered while the revoke waits", m)
	}
	finish()
	if m := readMsg(t, c); m.Type() != wire.TypeOK || m.(*wire.OK).Req != 1 {
		t.Fatalf("the waiting revoke was answered %#v, want OK once its transfer let go", m)
	}
}

func TestUnregisterWaitCapped(t *testing.T) {
	for _, tc := range []struct {
		ms   uint32
		want time.Duration
	}{
		{1, time.Millisecond},
		{10000, 10 * time.Second},
		{600000, MaxUnregisterWait},
		{math.MaxUint32, MaxUnregisterWait},
	} {
		if got := unregisterWait(tc.ms); got != tc.want {
			t.Errorf("unregisterWait(%d) = %v, want %v", tc.ms, got, tc.want)
		}
	}
}

func TestMaxClients(t *testing.T) {
	_, path, _ := serve(t, 1)
	c := dial(t, path)
	if err := unixsock.WriteFrame(c, &wire.Register{Req: 1, Name: "a"}, -1); err != nil {
		t.Fatal(err)
	}
	if _, _, _, _, err := unixsock.ReadFrame(c, nil); err != nil {
		t.Fatalf("first client: %v", err)
	}
	wantRefused(t, "a client past limits.max_clients", dial(t, path), wire.CodeBusy, "limits.max_clients (1)")
}
