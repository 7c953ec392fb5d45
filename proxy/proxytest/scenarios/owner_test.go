package scenarios_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// Ownership (PROTOCOL.md 9.18): an engine's regions, KV caches and
// transfers are its connection's and its group's. These engines are plain
// connections, as clients that predate Join are, unless they join.

// engineConn is a plain connection to sc, closed by the test's cleanup
// if the test has not.
func engineConn(t *testing.T, sc *proxytest.Sidecar) *client.Client {
	t.Helper()
	cl, err := client.Dial(sc.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// joined is a connection to sc in the group token.
func joined(t *testing.T, sc *proxytest.Sidecar, token string) *client.Client {
	t.Helper()
	cl := engineConn(t, sc)
	if err := cl.Join(context.Background(), []byte(token)); err != nil {
		t.Fatalf("Join: %v", err)
	}
	return cl
}

// freshCache is a cache of 2 layers of size bytes registered by cl
// (poisoned, or filled from seed), freed by the test's cleanup; nobody
// unregisters it: its connection's end must.
func freshCache(t *testing.T, cl *client.Client, name string, size, seed uint64) *kvsim.Cache {
	t.Helper()
	return registerCache(t, cl, name, 2, size, seed)
}

// waitRegions waits until sc holds regions regions and mappings mappings.
func waitRegions(t *testing.T, sc *proxytest.Sidecar, regions, mappings int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := sc.Snapshot()
		if st.Regions == regions && st.Mappings == mappings {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d regions, %d mappings; want %d, %d", sc.Name, st.Regions, st.Mappings, regions, mappings)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func wantRefused(t *testing.T, what string, err error, code wire.Code, text string) {
	t.Helper()
	if err == nil || client.CodeOf(err) != code || !strings.Contains(err.Error(), text) {
		t.Fatalf("%s: got %v, want %v mentioning %q", what, err, code, text)
	}
}

// TestEngineRestart: a decode engine whose connection closes (killed, or
// exited without unregistering) takes its regions with it; the engine
// started again registers the same names at once, and KV moves again.
func TestEngineRestart(t *testing.T) {
	pre, dec := proxytest.Pair(t, e2eOpts())
	pre.ExpectIdle(t, 1)
	dec.ExpectIdle(t, 1)
	S := newCache(t, pre, "s", 2, 1<<20, uint64(time.Now().UnixNano()))
	ms := kvsim.Ranges(S, 256<<10)
	for round := range 3 {
		cl := engineConn(t, dec)
		D := freshCache(t, cl, "d", 1<<20, 0) // the same names every round
		run(t, pre.Client, wire.Push, "restart", S, D, ms)
		if err := kvsim.Verify(S, D, ms, guard); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		_ = cl.Close() // the engine dies
		waitRegions(t, dec, 0, 0)
	}
}

// TestOwnerGoneFailsTransfers: the transfers on a region whose engine's
// connection closes fail at once, saying the engine went away, on both
// sidecars; its regions go once they let go, and nothing leaks.
func TestOwnerGoneFailsTransfers(t *testing.T) {
	for _, tc := range []struct {
		name string
		dir  wire.Direction
		gone string // whose engine goes: the sender's (pre) or the peer's (dec)
	}{
		{"peer's push into it", wire.Push, "dec"},
		{"peer's pull from it", wire.Pull, "dec"},
		{"our push from it", wire.Push, "pre"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := e2eOpts()
			o.Configure = slowDevice(0.02) // 2 x 4 MiB take about 400 ms
			pre, dec := proxytest.Pair(t, o)
			pre.ExpectIdle(t, 1)
			dec.ExpectIdle(t, 1)
			ctx := context.Background()
			var (
				sub   <-chan *wire.Notify
				dying *client.Client
				S, D  *kvsim.Cache
			)
			submitter := pre.Client
			if tc.gone == "dec" {
				dying = engineConn(t, dec)
				S = newCache(t, pre, "s", 2, 4<<20, 7)
				D = freshCache(t, dying, "d", 4<<20, 0)
			} else {
				dying = engineConn(t, pre)
				submitter = dying
				S = freshCache(t, dying, "s", 4<<20, 7)
				D = newCache(t, dec, "d", 2, 4<<20, 0)
				var err error
				if sub, err = dec.Client.Subscribe(ctx); err != nil {
					t.Fatal(err)
				}
			}
			id, err := submitter.Submit(ctx, kvsim.Transfer(route, tc.dir, "gone", S, D, kvsim.Ranges(S, 1<<20)))
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // under way
			_ = dying.Close()
			if tc.gone == "dec" {
				st, err := pre.Client.Wait(ctx, id, 10*time.Second)
				wantRefused(t, "the transfer", err, wire.CodeCancelled, "engine went away")
				if st.Done == st.Total {
					t.Fatalf("the transfer moved all %d B before the engine went; make it slower", st.Total)
				}
				waitRegions(t, dec, 0, 0)
				return
			}
			select {
			case n := <-sub:
				if n.Code == wire.CodeOK || !strings.Contains(n.Message, "engine went away") {
					t.Fatalf("the receiver's Notify: %+v, want a failure saying the engine went away", n)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the receiver heard nothing of the push whose engine went away")
			}
			waitRegions(t, pre, 0, 0)
		})
	}
}

// TestOwnershipRefused: a second engine's connection cannot unregister,
// take the names of, push from, list, check, wait for or cancel the first
// one's regions, KV caches and transfers, nor hear of its transfers.
func TestOwnershipRefused(t *testing.T) {
	o := e2eOpts()
	o.Configure = slowDevice(0.02, "decode")
	pre, dec := proxytest.Pair(t, o)
	ctx := context.Background()
	a, b := engineConn(t, pre), engineConn(t, pre)
	A := freshCache(t, a, "a", 4<<20, 3)
	D := newCache(t, dec, "d", 2, 4<<20, 0)

	wantRefused(t, "Unregister", b.Unregister(ctx, A.Region(0)), wire.CodeAccessDenied, "another engine connection")
	wantRefused(t, "UnregisterWait", b.UnregisterWait(ctx, A.Region(0), time.Second), wire.CodeAccessDenied, "another engine connection")
	B, err := kvsim.New("a", 2, 4<<20, 12288) // the same names
	if err != nil {
		t.Fatal(err)
	}
	defer B.Close()
	wantRefused(t, "Register over its names", B.Register(ctx, b, wire.AccessAll), wire.CodeExists, "another engine connection")
	tr := kvsim.Transfer(route, wire.Push, "a", A, D, kvsim.Ranges(A, 1<<20))
	_, err = b.Submit(ctx, tr)
	wantRefused(t, "Submit from its regions", err, wire.CodeAccessDenied, "belongs to another engine connection")
	if rs, err := b.Regions(ctx); err != nil || len(rs) != 0 {
		t.Fatalf("the other's region list: got %v, %v; want none", rs, err)
	}
	if rs, err := a.Regions(ctx); err != nil || len(rs) != 2 {
		t.Fatalf("the owner's region list: got %v, %v; want its 2", rs, err)
	}
	id, err := a.Submit(ctx, tr)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Status(ctx, id)
	wantRefused(t, "Status", err, wire.CodeAccessDenied, "belongs to another engine connection")
	_, err = b.Wait(ctx, id, time.Second)
	wantRefused(t, "Wait", err, wire.CodeAccessDenied, "belongs to another engine connection")
	wantRefused(t, "Cancel", b.Cancel(ctx, id), wire.CodeAccessDenied, "belongs to another engine connection")
	if st, err := a.Wait(ctx, id, 30*time.Second); err != nil || st.State != wire.StateDone {
		t.Fatalf("the owner's transfer after the refusals: %+v, %v; want done", st, err)
	}

	// Notifications: only the owner of the regions a push landed in hears.
	owner, other := engineConn(t, dec), engineConn(t, dec)
	E := freshCache(t, owner, "e", 1<<20, 0)
	subs := make([]<-chan *wire.Notify, 2)
	for i, cl := range []*client.Client{owner, other} {
		if subs[i], err = cl.Subscribe(ctx); err != nil {
			t.Fatal(err)
		}
	}
	run(t, pre.Client, wire.Push, "to-e", newCache(t, pre, "f", 2, 1<<20, 5), E, kvsim.Ranges(E, 1<<20))
	select {
	case n := <-subs[0]:
		if !strings.HasPrefix(n.Tag, "to-e") {
			t.Fatalf("the owner heard %+v, want the push tagged to-e", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the owner of the regions heard nothing of the push into them")
	}
	select {
	case n := <-subs[1]:
		t.Fatalf("another engine heard of the push: %+v", n)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestGroupShares: connections that joined one group share regions,
// transfers and notifications; when one closes, its regions go, though
// its group lives on.
func TestGroupShares(t *testing.T) {
	pre, dec := proxytest.Pair(t, e2eOpts())
	ctx := context.Background()
	const token = "0123456789abcdef-an-engine"
	// On the decode side: one connection registers, another hears.
	rank0, sched := joined(t, dec, token), joined(t, dec, token)
	D := freshCache(t, rank0, "d", 1<<20, 0)
	sub, err := sched.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	S := newCache(t, pre, "s", 2, 1<<20, 9)
	run(t, pre.Client, wire.Push, "shared", S, D, kvsim.Ranges(S, 1<<20))
	select {
	case n := <-sub:
		if !strings.HasPrefix(n.Tag, "shared") || n.Code != wire.CodeOK {
			t.Fatalf("the group's subscriber heard %+v", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the group's other connection heard nothing of the push into its group's regions")
	}
	rs, err := sched.Regions(ctx)
	if err != nil || !slices.ContainsFunc(rs, func(r wire.RegionInfo) bool { return r.Name == D.Region(0) }) {
		t.Fatalf("the group's region list: %v, %v; want %s in it", rs, err, D.Region(0))
	}
	_ = rank0.Close()
	waitRegions(t, dec, 0, 0)
	if rs, err := sched.Regions(ctx); err != nil || len(rs) != 0 {
		t.Fatalf("the group's region list after rank0 closed: %v, %v; want none", rs, err)
	}

	// On the prefill side: one connection pushes from another's regions,
	// and the other waits for that transfer.
	owner, pusher := joined(t, pre, token), joined(t, pre, token) // another sidecar: another group
	P := freshCache(t, owner, "p", 1<<20, 11)
	E := newCache(t, dec, "e", 2, 1<<20, 0)
	id, err := pusher.Submit(ctx, kvsim.Transfer(route, wire.Push, "p", P, E, kvsim.Ranges(P, 1<<20)))
	if err != nil {
		t.Fatalf("a group's connection pushing from another's regions: %v", err)
	}
	if _, err := owner.Wait(ctx, id, 30*time.Second); err != nil {
		t.Fatalf("the group's other connection waiting for it: %v", err)
	}
	if err := kvsim.Verify(P, E, kvsim.Ranges(P, 1<<20), guard); err != nil {
		t.Fatal(err)
	}
	if err := pusher.Unregister(ctx, P.Region(1)); err != nil {
		t.Fatalf("a group's connection unregistering another's region: %v", err)
	}
}

// TestKVOwnership: a KV cache is its connection's: another connection
// cannot lay one over its regions, take its name or transfer from it;
// when the owner's connection closes, the cache goes with its regions,
// and its name is free.
func TestKVOwnership(t *testing.T) {
	pre, dec := proxytest.Pair(t, e2eOpts())
	ctx := context.Background()
	p := kvlayout.Params{DType: kvlayout.BF16, Blocks: 8, BlockSize: 16, Heads: 4, HeadHi: 4, HeadSize: 32}
	newKV := func(name string) *kvsim.KV {
		k, err := kvsim.NewKV(name, "vllm-flash", p, 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k.Close() })
		return k
	}
	a, b := engineConn(t, pre), engineConn(t, pre)
	A := newKV("kv-a")
	if err := A.Register(ctx, a, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, "RegisterKV over another's regions", b.RegisterKV(ctx, "kv-b", kvsim.WireLayout(&A.Layout), [][]string{{A.Region(0, 0)}}),
		wire.CodeAccessDenied, "belongs to another engine connection")
	B := newKV("kv-b")
	if err := B.Register(ctx, b, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, "RegisterKV of another's cache name", b.RegisterKV(ctx, "kv-a", kvsim.WireLayout(&B.Layout), [][]string{{B.Region(0, 0)}}),
		wire.CodeExists, "another engine connection")
	D := newKV("kv-d")
	if err := D.Register(ctx, engineConn(t, dec), wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	move := kvsim.KVMove{Layers: []int{0}, SrcTable: []uint32{1}, DstTable: []uint32{2}, Tokens: 16}
	_, err := b.SubmitKV(ctx, move.Submit(route, "kv", wire.Push, A, D))
	wantRefused(t, "SubmitKV from another's cache", err, wire.CodeAccessDenied, "belongs to another engine connection")
	id, err := a.SubmitKV(ctx, move.Submit(route, "kv", wire.Push, A, D))
	if err != nil {
		t.Fatalf("the owner's SubmitKV: %v", err)
	}
	if _, err := a.Wait(ctx, id, 30*time.Second); err != nil {
		t.Fatalf("the owner's KV push: %v", err)
	}
	_ = a.Close()
	waitRegions(t, pre, 1, 1) // b's region
	if err := newKV("kv-a").Register(ctx, b, wire.AccessAll); err != nil {
		t.Fatalf("the closed connection's KV cache name and regions, registered again: %v", err)
	}
}
