package scenarios_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// Tickets (PROTOCOL.md 9.19): an engine posts a ticket on its sidecar; it
// crosses the peers' session and waits in the inbox of the engine that
// opened it on the other side, for that engine's group only.

// post sends a push ticket for key from cl over proxytest.Route to inbox to.
func post(ctx context.Context, cl *client.Client, to, key, body string) error {
	return cl.PostTicket(ctx, wire.PostTicket{Route: proxytest.Route, Kind: wire.TicketPush, To: to, Key: key, Body: []byte(body)})
}

func codeOf(err error) wire.Code {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return wire.CodeOK
}

// TestTicketDelivered: a ticket posted on the prefill's sidecar reaches
// the engine that opened the inbox on the decode's, with the poster's
// node name; a failure notice too, at once; another group's connection
// takes nothing, and cannot take the name over; a closed engine's inbox
// goes with it.
func TestTicketDelivered(t *testing.T) {
	pre, dec := proxytest.Pair(t, proxytest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	owner, other := engineConn(t, dec), engineConn(t, dec)
	if err := owner.OpenInbox(ctx, "dec-engine"); err != nil {
		t.Fatal(err)
	}
	if err := other.OpenInbox(ctx, "dec-engine"); codeOf(err) != wire.CodeExists {
		t.Fatalf("another group opening the same inbox: got %v, want %s", err, wire.CodeExists)
	}
	poster := engineConn(t, pre)
	if err := post(ctx, poster, "dec-engine", "x1", `{"block_ids":[1,2]}`); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := poster.PostTicket(ctx, wire.PostTicket{Route: proxytest.Route, Kind: wire.TicketFailure, Key: "x2", Body: []byte("layout refused")}); err != nil {
		t.Fatal(err) // To "": the only inbox
	}
	if got, err := other.TakeTickets(ctx, 10, 50*time.Millisecond); err != nil || len(got) != 0 {
		t.Fatalf("another group's connection took %v, %v; want nothing", got, err)
	}
	got, err := owner.TakeTickets(ctx, 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("the failure notice took %v to arrive", d)
	}
	want := []wire.TicketItem{
		{From: "prefill", Kind: wire.TicketPush, To: "dec-engine", Key: "x1", Body: []byte(`{"block_ids":[1,2]}`)},
		{From: "prefill", Kind: wire.TicketFailure, To: "dec-engine", Key: "x2", Body: []byte("layout refused")},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("took %v, want %v", got, want)
	}
	// with no route: the session with the peer of that node name, whichever side dialed it (the decode
	// answers a prefill it has no route to)
	back := engineConn(t, pre)
	if err := back.OpenInbox(ctx, "pre-engine"); err != nil {
		t.Fatal(err)
	}
	if err := owner.PostTicket(ctx, wire.PostTicket{Peer: "prefill", Kind: wire.TicketFailure, To: "pre-engine", Key: "x4", Body: []byte("no")}); err != nil {
		t.Fatalf("a ticket back over the session the prefill dialed: %v", err)
	}
	if got, err := back.TakeTickets(ctx, 10, time.Second); err != nil || len(got) != 1 || got[0].From != "decode" || got[0].Key != "x4" {
		t.Fatalf("took %v, %v; want the decode's x4", got, err)
	}
	if err := owner.PostTicket(ctx, wire.PostTicket{Peer: "nobody", Kind: wire.TicketPush, Key: "x5"}); codeOf(err) != wire.CodeUnknownPeer {
		t.Fatalf("a ticket with no route to a peer with no session: got %v, want %s", err, wire.CodeUnknownPeer)
	}
	if err := post(ctx, poster, "nobody", "x3", "{}"); codeOf(err) != wire.CodeUnknownRegion || !strings.Contains(err.Error(), `"nobody"`) {
		t.Fatalf("a ticket for an inbox nobody opened: got %v, want %s naming it", err, wire.CodeUnknownRegion)
	}
	_ = owner.Close()
	deadline := time.Now().Add(5 * time.Second)
	for other.OpenInbox(ctx, "dec-engine") != nil {
		if time.Now().After(deadline) {
			t.Fatal("the inbox of a closed connection is still held")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTicketBeforeInbox: a ticket for an inbox not open yet (the engine
// behind it reconnecting after its sidecar restarted) waits for it and is
// queued once it opens; one for an inbox that never opens is refused after
// the wait (2 s), naming it; the decode counts both waits.
func TestTicketBeforeInbox(t *testing.T) {
	o := proxytest.Options{Metrics: true}
	pre, dec := proxytest.Pair(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	poster, owner := engineConn(t, pre), engineConn(t, dec)
	posted := waiting(t, dec, "inbox", func() error { return post(ctx, poster, "late", "k1", "{}") })
	if err := owner.OpenInbox(ctx, "late"); err != nil {
		t.Fatal(err)
	}
	if err := <-posted; err != nil {
		t.Fatalf("a ticket that came before its inbox: %v", err)
	}
	if got, err := owner.TakeTickets(ctx, 10, time.Second); err != nil || len(got) != 1 || got[0].Key != "k1" {
		t.Fatalf("took %v, %v; want k1", got, err)
	}
	t0 := time.Now()
	if err := post(ctx, poster, "never", "k2", "{}"); codeOf(err) != wire.CodeUnknownRegion || !strings.Contains(err.Error(), `"never"`) {
		t.Fatalf("a ticket for an inbox nobody opens: got %v, want %s naming it", err, wire.CodeUnknownRegion)
	}
	if d := time.Since(t0); d < 2*time.Second || d > 4*time.Second {
		t.Errorf("refused after %v, want after the 2 s wait", d)
	}
	metricsAre(t, dec, map[string]float64{
		`stage_kv_waits_total{for="inbox",result="came"}`:      1,
		`stage_kv_waits_total{for="inbox",result="timed_out"}`: 1,
		`stage_kv_waiting{for="inbox"}`:                        0,
	})
}

// TestTicketInboxFull: a full inbox refuses the next ticket with
// CodeBusy, which the poster hears; once taken, tickets go again.
func TestTicketInboxFull(t *testing.T) {
	pre, dec := proxytest.Pair(t, proxytest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	owner, poster := engineConn(t, dec), engineConn(t, pre)
	if err := owner.OpenInbox(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("7", wire.MaxTicketBody)
	n := 0
	var err error
	for ; n < 2000; n++ {
		if err = post(ctx, poster, "d", fmt.Sprint("k", n), big); err != nil {
			break
		}
	}
	if codeOf(err) != wire.CodeBusy || !strings.Contains(err.Error(), "full") {
		t.Fatalf("ticket %d: got %v, want %s saying the inbox is full", n, err, wire.CodeBusy)
	}
	if n != (16<<20)/wire.MaxTicketBody {
		t.Errorf("the inbox took %d tickets of %d bytes, want %d (16 MiB)", n, wire.MaxTicketBody, (16<<20)/wire.MaxTicketBody)
	}
	got, err := owner.TakeTickets(ctx, 4, 0)
	if err != nil || len(got) != 4 || got[0].Key != "k0" || got[3].Key != "k3" {
		t.Fatalf("took %d tickets (%v), want k0..k3", len(got), err)
	}
	if err := post(ctx, poster, "d", "again", big); err != nil {
		t.Fatalf("after taking some: %v", err)
	}
}

// TestTicketBurst: 64 tickets posted at once (8 engine connections, 8
// each), all arrive.
func TestTicketBurst(t *testing.T) {
	pre, dec := proxytest.Pair(t, proxytest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	owner := engineConn(t, dec)
	if err := owner.OpenInbox(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	conns := []*client.Client{}
	for range 8 {
		conns = append(conns, engineConn(t, pre))
	}
	for i := range 64 {
		cl := conns[i%8]
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- post(ctx, cl, "d", fmt.Sprint("b", i), `{"i":1}`)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	seen := map[string]bool{}
	for len(seen) < 64 && ctx.Err() == nil {
		got, err := owner.TakeTickets(ctx, 100, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range got {
			seen[it.Key] = true
		}
	}
	if len(seen) != 64 {
		t.Fatalf("%d of 64 tickets arrived", len(seen))
	}
}
