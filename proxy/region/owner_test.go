package region

import (
	"slices"
	"testing"
	"time"

	"github.com/stage-kv/stage/wire"
)

// eng owns newTable's regions; other is another engine's connection,
// mate a second connection of eng's group.
var (
	eng   = Owner{Conn: 1, Group: "c:1"}
	other = Owner{Conn: 2, Group: "c:2"}
	mate  = Owner{Conn: 3, Group: "c:1"}
)

// TestOwnRefused: another group's engine cannot unregister, acquire or
// list a region, nor register its name; a connection of the owner's group
// can do all of it; peers (AcquireAll) are not an engine.
func TestOwnRefused(t *testing.T) {
	tb, _, _ := newTable(t)
	wantCode(t, "Unregister", tb.Unregister(other.Group, "a"), wire.CodeAccessDenied, "another engine connection")
	wantCode(t, "UnregisterWait", tb.UnregisterWait(other.Group, "a", time.Second, nil), wire.CodeAccessDenied, "another engine connection")
	_, err := tb.AcquireOwn(other.Group, []string{"a"}, wire.AccessLocalRead)
	wantCode(t, "AcquireOwn", err, wire.CodeAccessDenied, `region "a" belongs to another engine connection`)
	wantCode(t, "Register", tb.Register(other, "a", alloc, wire.AccessAll, 0, 1), wire.CodeExists, "another engine connection")
	if got := tb.InfosOf(other.Group); len(got) != 0 {
		t.Fatalf("InfosOf(other): got %v, want none", got)
	}
	rs, err := tb.AcquireOwn(mate.Group, []string{"a", "b"}, wire.AccessLocalRead)
	if err != nil {
		t.Fatalf("AcquireOwn by the group: got %v, want nil", err)
	}
	ReleaseAll(rs)
	rs, err = tb.AcquireAll([]string{"a"}, wire.AccessRemoteRead)
	if err != nil {
		t.Fatalf("AcquireAll (a peer): got %v, want nil", err)
	}
	ReleaseAll(rs)
	if got := len(tb.InfosOf(mate.Group)); got != 3 {
		t.Fatalf("InfosOf(group): got %d regions, want 3", got)
	}
	if err := tb.Unregister(mate.Group, "a"); err != nil {
		t.Fatalf("Unregister by the group: got %v, want nil", err)
	}
}

// TestReleaseConn: a closed connection's regions leave the table at once;
// one a transfer holds stays mapped, unnamed, until released, while its
// name is registered again.
func TestReleaseConn(t *testing.T) {
	tb, d, revoked := newTable(t)
	if err := tb.Register(mate, "m", alloc, wire.AccessAll, 8192, 1); err != nil {
		t.Fatal(err)
	}
	held, err := tb.AcquireOwn(eng.Group, []string{"c"}, wire.AccessLocalRead)
	if err != nil {
		t.Fatal(err)
	}
	gone := tb.ReleaseConn(eng.Conn)
	names := []string{}
	for _, r := range gone {
		names = append(names, r.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"a", "b", "c"}) {
		t.Fatalf("ReleaseConn: got %v, want a, b, c", names)
	}
	if regions, mappings := tb.Count(); regions != 1 || mappings != 2 {
		t.Fatalf("after ReleaseConn: got %d regions, %d mappings; want 1 (m), 2 (c held)", regions, mappings)
	}
	if err := tb.Register(other, "c", alloc, wire.AccessAll, 0, 1); err != nil {
		t.Fatalf("Register of a released name while an old region holds it: got %v, want nil", err)
	}
	ReleaseAll(held)
	if _, closed := d.counts(); closed != 1 {
		t.Fatalf("after the holder let go: %d imports closed, want 1 (c's)", closed)
	}
	slices.Sort(*revoked)
	if !slices.Equal(*revoked, []string{"a", "b", "c"}) {
		t.Fatalf("onUnregister heard %v, want a, b, c", *revoked)
	}
	if got := tb.ReleaseConn(eng.Conn); len(got) != 0 {
		t.Fatalf("ReleaseConn again: got %d regions, want none", len(got))
	}
	tb.CloseAll()
}
