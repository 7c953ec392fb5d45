package proxytest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// TestUnregisterWaitForTransfers: a confirmed Unregister (WaitMs) of a
// region a transfer holds is refused busy when the transfer outlasts the
// wait, and the region stays; given long enough, it is answered only once
// the transfer let go, with the allocation's import closed by then. The
// transfer is a push to a peer that never answers its handshake: it holds
// its regions for the route's connect_timeout.
func TestUnregisterWaitForTransfers(t *testing.T) {
	const connect = 1500 * time.Millisecond
	o := proxytest.Options{Configure: func(name string, c *config.Config) {
		for i := range c.Routes {
			c.Routes[i].ConnectTimeout = connect
		}
	}}
	pre := proxytest.Start(t, "prefill", silentPeer(t), o)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	P, err := kvsim.New("p", layers, layerBytes, guard) // p/0 and p/1: one allocation
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = P.Close() })
	if err := P.Register(ctx, pre.Client, wire.AccessLocalRead); err != nil {
		t.Fatal(err)
	}
	D, err := kvsim.New("d", layers, layerBytes, guard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = D.Close() })
	counts := func(when string, regions, mappings int) {
		t.Helper()
		st, err := pre.Client.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Regions != regions || st.Mappings != mappings {
			t.Fatalf("%s: got %d regions, %d mappings; want %d, %d", when, st.Regions, st.Mappings, regions, mappings)
		}
	}

	push := kvsim.Transfer(proxytest.Route, wire.Push, "t", P, D, kvsim.Ranges(P, 256<<10)[:1])
	push.LocalNames, push.RemoteNames = push.LocalNames[:1], push.RemoteNames[:1] // p/0 only
	t0 := time.Now()
	pushed := make(chan error, 1)
	go func() {
		_, err := pre.Client.Do(ctx, push)
		pushed <- err
	}()
	time.Sleep(200 * time.Millisecond) // the push is in, holding p/0 while it waits for its session

	err = pre.Client.UnregisterWait(ctx, P.Region(0), 200*time.Millisecond)
	if c := client.CodeOf(err); c != wire.CodeBusy || !strings.Contains(err.Error(), "1 transfer(s) still use it") {
		t.Fatalf("UnregisterWait of a held region: got %v (code %v), want busy: 1 transfer still uses it", err, c)
	}
	counts("after the busy answer", 2, 1)

	if err := pre.Client.UnregisterWait(ctx, P.Region(1), 5*time.Second); err != nil {
		t.Fatalf("UnregisterWait of p/1, which no transfer holds: %v", err)
	}
	if e := time.Since(t0); e >= connect {
		t.Fatalf("p/1's UnregisterWait took until %v after the push began, want it at once", e)
	}
	counts("p/0 still uses the allocation", 1, 1)

	unregistered := make(chan error, 1)
	go func() { unregistered <- pre.Client.UnregisterWait(ctx, P.Region(0), 20*time.Second) }()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-unregistered:
		t.Fatalf("UnregisterWait of p/0 answered %v while the push held it", err)
	default:
	}
	counts("while the Unregister waits", 1, 1) // and the connection's other requests are answered
	if err := <-unregistered; err != nil {
		t.Fatalf("UnregisterWait of p/0: %v", err)
	}
	if e := time.Since(t0); e < connect {
		t.Fatalf("UnregisterWait of p/0 answered %v after the push began, before its connect_timeout (%v) let the region go", e, connect)
	}
	counts("after the confirmed unregister", 0, 0)
	if err := <-pushed; err == nil {
		t.Fatal("the push to a silent peer succeeded")
	}
	pre.ExpectIdle(t, 0)
}
