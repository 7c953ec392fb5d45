package scenarios_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// kvRun submits a KV transfer and waits for it: nil when done, else why it
// failed (refused at submit, or by the peer's Nack).
func kvRun(t *testing.T, cl *client.Client, s wire.SubmitKV) error {
	t.Helper()
	ctx := context.Background()
	id, err := cl.SubmitKV(ctx, s)
	if err != nil {
		return err
	}
	_, err = cl.Wait(ctx, id, 30*time.Second)
	return err
}

func newKey(t *testing.T) []byte {
	t.Helper()
	k, err := client.GrantKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestKVGrants (issue 33 item 4): once the serving engine made a grant,
// its sidecar serves a pull only to a request naming a live grant that
// covers exactly its blocks: without a key, with a made-up key, with the
// right key and other blocks, a second time, after expiry and after a
// revoke it is refused and the puller's cache is untouched; with the
// grant it moves once. A push is the same with a write grant. A raw
// byte-range pull of the guarded cache's regions is refused too, over TCP
// and between sidecars on one node (its handles are not handed out).
func TestKVGrants(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts func(t *testing.T) proxytest.Options
	}{
		{"tcp", func(*testing.T) proxytest.Options { return e2eOpts() }},
		{"same node", oneNode},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.opts(t)
			o.Metrics = true // kvGrantPush watches the push wait
			kvGrants(t, o)
		})
	}
}

func kvGrants(t *testing.T, o proxytest.Options) {
	pre, dec := proxytest.Pair(t, o)
	p := kvlayout.Params{DType: kvlayout.F16, Blocks: 8, BlockSize: 16, Heads: 4, HeadHi: 4, HeadSize: 32}
	own := kvCache(t, pre, "own", "vllm-flash", p, 1, 0)
	victim := kvCache(t, dec, "victim", "vllm-flash", p, 1, 9)
	m := kvsim.KVMove{Layers: []int{0}, SrcTable: []uint32{1, 5}, DstTable: []uint32{2, 3}, Tokens: 32}
	pull := func(key []byte, blocks ...uint32) wire.SubmitKV {
		s := m.Submit(route, "g", wire.Pull, own, victim)
		s.Key = key
		if blocks != nil {
			s.RemoteBlocks = blocks
		}
		return s
	}
	ctx := context.Background()
	// Unguarded (no grant yet, require_grants off): a keyless pull works as before.
	if err := kvRun(t, pre.Client, pull(nil)); err != nil {
		t.Fatalf("keyless pull from an unguarded cache: %v", err)
	}
	if err := own.Poison(guard); err != nil {
		t.Fatal(err)
	}
	poisoned, err := own.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	key, short := newKey(t), newKey(t)
	if err := dec.Client.Grant(ctx, victim.Name, key, false, m.SrcTable, time.Minute, 1); err != nil {
		t.Fatal(err)
	}
	if err := dec.Client.Grant(ctx, victim.Name, short, false, m.SrcTable, 50*time.Millisecond, 1); err != nil {
		t.Fatal(err)
	}
	revoked := newKey(t)
	if err := dec.Client.Grant(ctx, victim.Name, revoked, false, m.SrcTable, time.Minute, 1); err != nil {
		t.Fatal(err)
	}
	if err := dec.Client.RevokeGrant(ctx, victim.Name, revoked); err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond) // short expires
	refused := func(what string, s wire.SubmitKV, want string) {
		t.Helper()
		err := kvRun(t, pre.Client, s)
		if err == nil || client.CodeOf(err) != wire.CodeAccessDenied || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: got %v, want access denied naming %q", what, err, want)
		}
	}
	refused("no key", pull(nil), "no live grant")
	refused("made-up key", pull(newKey(t)), "no live grant")
	refused("expired", pull(short), "no live grant")
	refused("revoked", pull(revoked), "no live grant")
	refused("more blocks", pull(key, 1, 5, 6), "covers other blocks")
	refused("other blocks", pull(key, 1, 6), "covers other blocks")
	refused("a write", func() wire.SubmitKV { s := m.Submit(route, "w", wire.Push, own, victim); s.Key = key; return s }(), "other direction")
	got, err := own.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "puller's cache after refused pulls", got, poisoned)
	if err := kvRun(t, pre.Client, pull(key)); err != nil {
		t.Fatalf("pull with its grant: %v", err)
	}
	if err := kvsim.Expect(victim, own, poisoned, kvsim.KVMove{Layers: m.Layers, SrcTable: m.SrcTable, DstTable: m.DstTable, Tokens: m.Tokens}); err != nil {
		t.Fatalf("pull with its grant: %v", err)
	}
	refused("the same key again", pull(key), "no live grant")

	// The guarded cache's regions refuse raw byte-range pulls.
	tr, ok := own.ByteOps(victim, &m)
	if !ok {
		t.Fatal("no byte ops for the move")
	}
	tr.Route, tr.Dir, tr.Tag = route, wire.Pull, "raw"
	if _, err := pre.Client.Do(ctx, tr); client.CodeOf(err) != wire.CodeAccessDenied || !strings.Contains(fmt0(err), "guarded by grants") {
		t.Fatalf("raw pull of a guarded cache's region: got %v, want access denied", err)
	}

	kvGrantPush(t, pre, dec, p, m, refused)
}

// kvGrantPush: the receiving engine grants writes into the blocks it
// allocated; a push without the key is refused, with it it lands, and
// after the revoke it is refused again (a key no grant names, after
// waiting for one: kvGrantWait); a push whose grant comes after it lands.
func kvGrantPush(t *testing.T, pre, dec *proxytest.Sidecar, p kvlayout.Params, m kvsim.KVMove, refused func(string, wire.SubmitKV, string)) {
	ctx := context.Background()
	into := kvCache(t, dec, "into", "vllm-flash", p, 1, 0)
	src := kvCache(t, pre, "src", "vllm-flash", p, 1, 4)
	wkey := newKey(t)
	if err := dec.Client.Grant(ctx, into.Name, wkey, true, m.DstTable, time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	push := func(key []byte) wire.SubmitKV { s := m.Submit(route, "p", wire.Push, src, into); s.Key = key; return s }
	refused("push without a key", push(nil), "no live grant")
	refused("push with a made-up key", push(newKey(t)), "no live grant")
	if err := kvRun(t, pre.Client, push(wkey)); err != nil {
		t.Fatalf("push with its grant: %v", err)
	}
	if err := dec.Client.RevokeGrant(ctx, into.Name, wkey); err != nil {
		t.Fatal(err)
	}
	refused("push after the revoke", push(wkey), "no live grant")

	// A push that comes before its grant (vLLM's scheduler posts the push
	// ticket while its worker grants at the next step) waits for it and
	// lands once it comes.
	late := newKey(t)
	done := waiting(t, dec, "grant", func() error { return kvRun(t, pre.Client, push(late)) })
	if err := dec.Client.Grant(ctx, into.Name, late, true, m.DstTable, time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("push whose grant came after it: %v", err)
	}
	if err := metricReaches(dec, `stage_kv_waiting{for="grant"}`, 0); err != nil {
		t.Fatalf("after the push that waited: %v", err)
	}
}

func fmt0(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestKVGrantEngine: grants are the owning group's and bounded: another
// connection may not grant on a cache it does not own, a block past the
// cache is refused, and the engine's own calls check their arguments.
func TestKVGrantEngine(t *testing.T) {
	pre, dec := proxytest.Pair(t, e2eOpts())
	p := kvlayout.Params{DType: kvlayout.F16, Blocks: 8, BlockSize: 16, Heads: 4, HeadHi: 4, HeadSize: 32}
	c := kvCache(t, dec, "c", "vllm-flash", p, 1, 1)
	ctx := context.Background()
	other, err := client.Dial(dec.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, tt := range []struct {
		what string
		err  error
		want string
	}{
		{"another connection's cache", other.Grant(ctx, c.Name, newKey(t), false, []uint32{1}, time.Minute, 1), "no KV cache"},
		{"a cache of the peer", pre.Client.Grant(ctx, c.Name, newKey(t), false, []uint32{1}, time.Minute, 1), "no KV cache"},
		{"a block past the cache", dec.Client.Grant(ctx, c.Name, newKey(t), false, []uint32{1, 8}, time.Minute, 1), "block #1 is 8, the cache has 8"},
		{"a short key", dec.Client.Grant(ctx, c.Name, []byte("short"), false, []uint32{1}, time.Minute, 1), "5-byte key"},
		{"no ttl", dec.Client.Grant(ctx, c.Name, newKey(t), false, []uint32{1}, 0, 1), "want 1ms"},
		{"revoke on another's cache", other.RevokeGrant(ctx, c.Name, newKey(t)), "no KV cache"},
	} {
		if tt.err == nil || !strings.Contains(tt.err.Error(), tt.want) {
			t.Errorf("%s: got %v, want an error naming %q", tt.what, tt.err, tt.want)
		}
	}
}

// TestKVRequireGrants: with security.require_grants a cache is guarded from
// its registration: a keyless pull is refused before its engine made any
// grant, and one with a grant moves.
func TestKVRequireGrants(t *testing.T) {
	o := e2eOpts()
	o.Configure = func(name string, c *config.Config) { c.Security.RequireGrants = name == "decode" }
	pre, dec := proxytest.Pair(t, o)
	p := kvlayout.Params{DType: kvlayout.F16, Blocks: 8, BlockSize: 16, Heads: 4, HeadHi: 4, HeadSize: 32}
	own := kvCache(t, pre, "own", "vllm-flash", p, 1, 0)
	victim := kvCache(t, dec, "victim", "vllm-flash", p, 1, 9)
	m := kvsim.KVMove{Layers: []int{0}, SrcTable: []uint32{1, 5}, DstTable: []uint32{2, 3}, Tokens: 32}
	s := m.Submit(route, "g", wire.Pull, own, victim)
	if err := kvRun(t, pre.Client, s); client.CodeOf(err) != wire.CodeAccessDenied {
		t.Fatalf("keyless pull with require_grants: got %v, want access denied", err)
	}
	s.Key = newKey(t)
	if err := dec.Client.Grant(context.Background(), victim.Name, s.Key, false, m.SrcTable, time.Minute, 1); err != nil {
		t.Fatal(err)
	}
	if err := kvRun(t, pre.Client, s); err != nil {
		t.Fatalf("pull with its grant: %v", err)
	}
}

// TestKVRevokeFences: an engine revokes a grant when it hands the blocks
// back to its allocator (a receive that failed or timed out, a hold whose
// lease ran out). A peer transfer admitted under the key and still under
// way then must not touch the blocks once RevokeGrant answered: the
// revoke stops it and answers once the copies under way ended. A push
// into us fails with access denied, and the blocks hold afterwards exactly
// what they held at the answer; a pull from us fails (cancelled).
func TestKVRevokeFences(t *testing.T) {
	for _, dir := range []wire.Direction{wire.Push, wire.Pull} {
		t.Run(dir.String(), func(t *testing.T) { revokeUnderWay(t, dir) })
	}
}

func revokeUnderWay(t *testing.T, dir wire.Direction) {
	o := e2eOpts()
	o.SlotSize, o.Configure = 64*config.KiB, slowDevice(0.02, "decode") // 8 MiB take about 400 ms there
	pre, dec := proxytest.Pair(t, o)
	p := kvlayout.Params{DType: kvlayout.F16, Blocks: 64, BlockSize: 16, Heads: 8, HeadHi: 8, HeadSize: 128}
	theirs := kvCache(t, dec, "theirs", "vllm-flash", p, 2, 0) // the granting engine's
	ours := kvCache(t, pre, "ours", "vllm-flash", p, 2, 4)
	if dir == wire.Push {
		if err := theirs.Poison(guard); err != nil {
			t.Fatal(err)
		}
	}
	table := make([]uint32, p.Blocks)
	for i := range table {
		table[i] = uint32(i)
	}
	m := kvsim.KVMove{Layers: []int{0, 1}, SrcTable: table, DstTable: table, Tokens: uint32(p.Blocks * p.BlockSize)}
	ctx := context.Background()
	key := newKey(t)
	if err := dec.Client.Grant(ctx, theirs.Name, key, dir == wire.Push, table, time.Minute, 1); err != nil {
		t.Fatal(err)
	}
	s := m.Submit(route, "fenced", dir, ours, theirs)
	s.Key = key
	id, err := pre.Client.SubmitKV(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for { // some rows moved, not all
		st, err := pre.Client.Status(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == wire.StateDone || st.State == wire.StateFailed {
			t.Fatalf("the %v ended (%v) before it was seen under way: slow the device further", dir, st.State)
		}
		if st.Done > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no chunk of the %v moved in 20 s", dir)
		}
		time.Sleep(time.Millisecond)
	}
	if err := dec.Client.RevokeGrant(ctx, theirs.Name, key); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	atRevoke, err := theirs.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	st, err := pre.Client.Wait(ctx, id, 30*time.Second)
	if err == nil {
		t.Fatalf("the %v ended well (%d of %d B) although its grant was revoked under way", dir, st.Done, st.Total)
	}
	want := wire.CodeCancelled // a pull we served: the sender core cancelled it
	if dir == wire.Push {
		want = wire.CodeAccessDenied
	}
	if client.CodeOf(err) != want || (dir == wire.Push && !strings.Contains(err.Error(), "revoked")) {
		t.Fatalf("the revoked %v failed with %v; want %v", dir, err, want)
	}
	if dir == wire.Pull {
		return
	}
	time.Sleep(200 * time.Millisecond) // anything still on its way would land now
	after, err := theirs.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "the receiving cache after the revoke answered", after, atRevoke)
	if bytes.Equal(atRevoke, bytes.Repeat([]byte{guard}, len(atRevoke))) {
		t.Fatal("nothing landed before the revoke: the test did not revoke a push under way")
	}
}
