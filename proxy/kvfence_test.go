package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/wire"
)

// TestRevokeFencesAdmittedTransfers: RevokeGrant answers only once every
// peer transfer admitted under the key let go of the cache's regions. It
// stops each first (an armed one at once, one armed after the revoke as
// soon as it is armed); a transfer admitted under another key is neither
// stopped nor waited for; a key whose transfers ended answers at once,
// and a revoked key admits nothing more.
func TestRevokeFencesAdmittedTransfers(t *testing.T) {
	noLeaks(t)
	f := newKVAdmitFixture(t, "kvfence")
	s, cl, ss := f.s, f.cl, f.ss
	ctx := context.Background()
	keyA, keyB := []byte("0123456789abcdef"), []byte("fedcba9876543210")
	blocks := []uint32{2, 3}
	for _, key := range [][]byte{keyA, keyB} {
		if err := cl.Grant(ctx, "kv", key, true, blocks, time.Minute, 0); err != nil {
			t.Fatal(err)
		}
	}
	admit := func(key []byte) *kvSide {
		t.Helper()
		ks, err := s.kv.admit(ss, f.request(2, blocks, key), wire.AccessRemoteWrite)
		if err != nil {
			t.Fatalf("admit: %v", err)
		}
		if ks.use == nil {
			t.Fatal("admitted under a key without a use of it")
		}
		return ks
	}
	armed, late, other := admit(keyA), admit(keyA), admit(keyB)
	stopped := make(chan error, 2)
	armed.use.arm(func(err error) { stopped <- err })

	revoked := make(chan error, 1)
	go func() { revoked <- cl.RevokeGrant(ctx, "kv", keyA) }()
	select {
	case err := <-stopped:
		if errCode(err) != wire.CodeAccessDenied {
			t.Fatalf("the armed transfer was stopped with %v; want %v", err, wire.CodeAccessDenied)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the revoke did not stop the transfer admitted under its key")
	}
	late.use.arm(func(err error) { stopped <- err }) // armed after the revoke: stopped at once
	if err := <-stopped; err == nil {
		t.Fatal("a transfer armed after the revoke was stopped without a reason")
	}
	for i, ks := range []*kvSide{armed, late} {
		select {
		case err := <-revoked:
			t.Fatalf("the revoke answered (%v) while %d transfers under its key held the blocks", err, 2-i)
		case <-time.After(50 * time.Millisecond):
		}
		region.ReleaseAll(ks.regions)
		ks.use.end()
	}
	select {
	case err := <-revoked:
		if err != nil {
			t.Fatalf("revoke: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the revoke did not answer once its transfers let go")
	}
	// the other key's transfer was neither stopped nor waited for
	other.use.arm(func(err error) { stopped <- err })
	select {
	case err := <-stopped:
		t.Fatalf("a transfer under another key was stopped: %v", err)
	default:
	}
	region.ReleaseAll(other.regions)
	other.use.end()
	if err := cl.RevokeGrant(ctx, "kv", keyB); err != nil {
		t.Fatalf("revoking a key whose transfer ended: %v", err)
	}
	// the revoked key admits nothing more
	if ks, err := s.kv.admit(ss, f.request(4, blocks, keyA), wire.AccessRemoteWrite); err == nil {
		region.ReleaseAll(ks.regions)
		t.Fatal("a revoked key admitted a push")
	}
}

// TestFenceTimesOut: a use that never lets go makes fence answer with
// CodeTimeout after revokeFence, naming how many still hold the blocks.
func TestFenceTimesOut(t *testing.T) {
	if testing.Short() {
		t.Skip("waits revokeFence")
	}
	tab, c := &kvTable{}, &kvCache{uses: uses{}}
	u, ended := tab.addUseLocked(c, []byte("k")), tab.addUseLocked(c, []byte("k"))
	ended.end()
	err := fence("kv", []*grantUse{ended, u})
	if errCode(err) != wire.CodeTimeout || !strings.Contains(err.Error(), "1 of the 2") {
		t.Fatalf("fence: %v; want %v naming 1 of the 2 transfers", err, wire.CodeTimeout)
	}
	u.end()
	if len(c.uses) != 0 {
		t.Fatalf("%d uses left after both ended", len(c.uses))
	}
}
