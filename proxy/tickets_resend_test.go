package proxy

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stage-kv/stage/wire"
)

// TestTicketMemo: what is sent again after a peer's sessions closed: the
// tickets it queued within resendAge of the close, once, when a session
// comes back within resendWithin; nothing for another peer, nothing
// later; bounded in count and bytes.
func TestTicketMemo(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tk := func(key string, n int) *wire.Ticket {
		return &wire.Ticket{Kind: wire.TicketPush, To: "in", Key: key, Body: bytes.Repeat([]byte{'x'}, n)}
	}
	keys := func(ts []wire.Ticket) string {
		var b bytes.Buffer
		for _, t := range ts {
			fmt.Fprintf(&b, "%s ", t.Key)
		}
		return b.String()
	}
	for _, tc := range []struct {
		name   string
		queued []time.Duration // when each ticket k0, k1, ... was queued, after t0
		closed time.Duration
		up     time.Duration
		want   string
	}{
		{"the last second's, back at once", []time.Duration{0, 1500 * time.Millisecond, 1900 * time.Millisecond}, 2 * time.Second, 2500 * time.Millisecond, "k1 k2 "},
		{"back within 10 s", []time.Duration{0}, 500 * time.Millisecond, 10 * time.Second, "k0 "},
		{"back too late", []time.Duration{0}, 500 * time.Millisecond, 11 * time.Second, ""},
		{"all older than a second", []time.Duration{0, 100 * time.Millisecond}, 3 * time.Second, 3 * time.Second, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m ticketMemo
			for i, d := range tc.queued {
				m.queued("p", tk(fmt.Sprint("k", i), 8), t0.Add(d))
			}
			m.queued("other", tk("o", 8), t0.Add(tc.closed))
			m.closed("p", t0.Add(tc.closed))
			if got := keys(m.takeLost("p", t0.Add(tc.up))); got != tc.want {
				t.Fatalf("sent again %q, want %q", got, tc.want)
			}
			if got := m.takeLost("p", t0.Add(tc.up)); len(got) != 0 {
				t.Fatalf("sent again twice: %v", keys(got))
			}
		})
	}
	// a copy is kept: the poster's buffer may change after
	body := []byte("abc")
	var m ticketMemo
	m.queued("p", &wire.Ticket{Key: "k", Body: body}, t0)
	body[0] = 'z'
	m.closed("p", t0)
	if got := m.takeLost("p", t0); len(got) != 1 || string(got[0].Body) != "abc" {
		t.Fatalf("kept %v", got)
	}
	// bounds: resendMax tickets, resendBytes bytes, the newest kept
	m = ticketMemo{}
	for i := range resendMax + 10 {
		m.queued("p", tk(fmt.Sprint("n", i), 1), t0)
	}
	m.closed("p", t0)
	if got := m.takeLost("p", t0); len(got) != resendMax || got[0].Key != "n10" {
		t.Fatalf("kept %d tickets from %q, want %d from n10", len(got), got[0].Key, resendMax)
	}
	for i := range 5 {
		m.queued("p", tk(fmt.Sprint("b", i), wire.MaxTicketBody), t0)
	}
	for i := range 20 {
		m.queued("p", tk(fmt.Sprint("b", 5+i), wire.MaxTicketBody), t0)
	}
	m.closed("p", t0)
	if got := m.takeLost("p", t0); len(got) != resendBytes/wire.MaxTicketBody || got[len(got)-1].Key != "b24" {
		t.Fatalf("kept %d tickets of %d bytes, want %d ending with b24", len(got), wire.MaxTicketBody, resendBytes/wire.MaxTicketBody)
	}
}
