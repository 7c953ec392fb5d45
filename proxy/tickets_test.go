package proxy

import (
	"fmt"
	"testing"
	"time"

	"github.com/stage-kv/stage/proxy/engine"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// TestInboxTable: the inboxes' rules without sockets: names by group,
// delivery to the only inbox or a named one, the bounds of one inbox and of
// all, taking by group in order, release with the connection.
func TestInboxTable(t *testing.T) {
	a, a2, b := engine.Owner{Conn: 1, Group: "g:a"}, engine.Owner{Conn: 2, Group: "g:a"}, engine.Owner{Conn: 3, Group: "c:3"}
	tk := func(to, key string, n int) *wire.Ticket {
		return &wire.Ticket{Kind: wire.TicketPush, To: to, Key: key, Body: make([]byte, n)}
	}
	code := func(err error) wire.Code {
		if err == nil {
			return wire.CodeOK
		}
		return status.Code(err)
	}
	var tb inboxTable
	tb.maxTickets, tb.maxBytes, tb.maxTotal = 3, 100, 150
	if err := tb.deliver("p", tk("", "k", 1)); code(err) != wire.CodeUnknownRegion {
		t.Fatalf("no inbox: got %v", err)
	}
	if err := tb.open(a, "ia"); err != nil {
		t.Fatal(err)
	}
	if err := tb.open(b, "ia"); code(err) != wire.CodeExists {
		t.Fatalf("another group's open: got %v, want exists", err)
	}
	if err := tb.deliver("p", tk("", "k0", 10)); err != nil { // the only inbox
		t.Fatal(err)
	}
	if err := tb.open(b, "ib"); err != nil {
		t.Fatal(err)
	}
	if err := tb.deliver("p", tk("", "k", 1)); code(err) != wire.CodeBadRequest {
		t.Fatalf("no name, two inboxes: got %v", err)
	}
	for i, tc := range []struct {
		to   string
		n    int
		want wire.Code
	}{
		{"ia", 90, wire.CodeOK},  // 100 bytes in ia
		{"ia", 1, wire.CodeBusy}, // ia's bytes
		{"ib", 50, wire.CodeOK},  // 150 in all
		{"ib", 1, wire.CodeBusy}, // every inbox's bytes
		{"nope", 1, wire.CodeUnknownRegion},
	} {
		if err := tb.deliver("p", tk(tc.to, fmt.Sprint("k", i+1), tc.n)); code(err) != tc.want {
			t.Fatalf("ticket %d to %s (%d bytes): got %v, want %s", i+1, tc.to, tc.n, err, tc.want)
		}
	}
	if got := tb.take(b, 10, 0, nil); len(got) != 1 || got[0].Key != "k3" {
		t.Fatalf("b took %v, want its k3 only", got)
	}
	if got := tb.take(a2, 1, 0, nil); len(got) != 1 || got[0].Key != "k0" || got[0].To != "ia" {
		t.Fatalf("a's group took %v, want k0 first (one asked)", got)
	}
	for range 2 { // three tickets at most: two more fit after one was taken
		if err := tb.deliver("p", tk("ia", "s", 0)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tb.deliver("p", tk("ia", "s", 0)); code(err) != wire.CodeBusy {
		t.Fatalf("a fourth ticket: got %v, want busy", err)
	}
	// a take that waits wakes at the next arrival
	done := make(chan []wire.TicketItem)
	go func() { done <- tb.take(b, 10, 5*time.Second, nil) }()
	time.Sleep(20 * time.Millisecond)
	if err := tb.deliver("p", tk("ib", "late", 1)); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-done:
		if len(got) != 1 || got[0].Key != "late" {
			t.Fatalf("the waiting take got %v", got)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a waiting take did not wake at the arrival")
	}
	if n := tb.releaseConn(1); n != 1 {
		t.Fatalf("released %d inboxes of connection 1, want 1", n)
	}
	if err := tb.open(b, "ia"); err != nil {
		t.Fatalf("the released name: %v", err)
	}
	if tb.total != 0 {
		t.Fatalf("%d bytes counted after every ticket was taken or released", tb.total)
	}
	// one answer carries at most takeBytes of bodies, so its frame stays under wire.MaxControlBody
	tb.maxTickets, tb.maxBytes, tb.maxTotal = 100, 64<<20, 64<<20
	for i := range 40 {
		if err := tb.deliver("p", tk("ia", fmt.Sprint("big", i), wire.MaxTicketBody)); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []int{takeBytes / wire.MaxTicketBody, 40 - takeBytes/wire.MaxTicketBody} {
		got := tb.take(b, 100, 0, nil)
		if len(got) != want {
			t.Fatalf("took %d tickets of %d bytes, want %d", len(got), wire.MaxTicketBody, want)
		}
		if n := len((&wire.Tickets{Items: got}).AppendBody(nil)); n > wire.MaxControlBody {
			t.Fatalf("a Tickets of %d bytes, over the frame limit", n)
		}
	}
	if err := tb.open(a, ""); code(err) != wire.CodeBadRequest {
		t.Fatalf("an empty name: got %v", err)
	}
}
