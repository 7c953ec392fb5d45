package proxytest_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// TestDeadPeerRefusedAtOnce: a submit to a peer that is down is refused
// with "peer unavailable" after one fresh dial, not after the route's
// connect_timeout (a minute here, longer than the test waits), whether
// the peer never came up or died under an open session; and a peer that
// comes back is used at once.
func TestDeadPeerRefusedAtOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there until the decode starts on it

	o := proxytest.Options{Configure: func(name string, c *config.Config) {
		if name == "decode" {
			c.Listen = addr
		}
		for i := range c.Routes {
			c.Routes[i].ConnectTimeout = time.Minute
		}
	}}
	pre := proxytest.Start(t, "prefill", addr, o)
	P := cache(t, pre, "p", wire.AccessLocalRead)
	if err := P.Fill(11); err != nil {
		t.Fatal(err)
	}
	D, err := kvsim.New("d", layers, layerBytes, guard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = D.Close() })
	if err := D.Poison(guardByte); err != nil {
		t.Fatal(err)
	}
	ms := kvsim.Ranges(P, 256<<10)[:2]
	push := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := pre.Client.Do(ctx, kvsim.Transfer(proxytest.Route, wire.Push, "t", P, D, ms))
		return err
	}
	refused := func(when string) {
		t.Helper()
		err := push()
		if c := client.CodeOf(err); c != wire.CodePeerUnavailable || !strings.Contains(err.Error(), "is down") {
			t.Fatalf("%s: push returned %v (code %v), want peer unavailable, refused as down before the test's 20 s", when, err, c)
		}
	}

	refused("peer never started")

	dec := proxytest.Start(t, "decode", "", o)
	if err := D.Register(context.Background(), dec.Client, wire.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	if err := push(); err != nil {
		t.Fatalf("push once the peer is up: %v", err)
	}
	if err := kvsim.Verify(P, D, ms, guardByte); err != nil {
		t.Fatalf("after the push: %v", err)
	}

	if err := dec.Close(); err != nil {
		t.Fatal(err)
	}
	// A push sent before the prefill side saw the session end may still
	// pick it and fail with "session closed" (CI's loaded 2-core machine
	// did): wait until the session is gone, then every push must be
	// refused as down.
	for deadline := time.Now().Add(5 * time.Second); pre.Snapshot().Sessions > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the prefill side still has a session 5 s after its peer closed")
		}
	}
	refused("peer closed under an open session")
	refused("and again")
}

// TestConnectingPeerWaitedAside: a peer that accepts connections but never
// answers the handshake is connecting, not down: a submit to it waits (up
// to connect_timeout), and waits aside: the same engine connection's
// other requests are answered meanwhile.
func TestConnectingPeerWaitedAside(t *testing.T) {
	o := proxytest.Options{Configure: func(name string, c *config.Config) {
		for i := range c.Routes {
			c.Routes[i].ConnectTimeout = time.Minute
		}
	}}
	pre := proxytest.Start(t, "prefill", silentPeer(t), o)
	P := cache(t, pre, "p", wire.AccessLocalRead)
	D, err := kvsim.New("d", layers, layerBytes, guard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = D.Close() })

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := pre.Client.Do(ctx, kvsim.Transfer(proxytest.Route, wire.Push, "t", P, D, kvsim.Ranges(P, 256<<10)[:1]))
		done <- err
	}()
	defer func() {
		cancel()
		<-done
	}()
	time.Sleep(100 * time.Millisecond) // the submit is in, waiting for the session
	sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer scancel()
	if _, err := pre.Client.Stats(sctx); err != nil {
		t.Fatalf("stats on the engine connection of a waiting submit: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("the submit to a connecting peer ended (%v); want it waiting up to connect_timeout", err)
	default:
	}
}

// silentPeer is the address of a peer that accepts connections and never
// answers the handshake: a route to it is connecting until its
// connect_timeout, and a submit to it holds its regions that long.
func silentPeer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c // never answered
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for len(held) > 0 {
			(<-held).Close()
		}
	})
	return ln.Addr().String()
}
