package routing

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// TestAllDown: a submit is refused only when every peer it could use is
// down and has failed one more dial since the submit first saw it down.
func TestAllDown(t *testing.T) {
	up := newSession("dec-b", "b:1")
	for _, tt := range []struct {
		name  string
		rc    config.Route
		peers []placed
		want  string
		fails []uint64 // fails of peer a:1 before each call
		got   []bool   // allDown's answer to each call
	}{
		{"down, then fails again", config.Route{}, []placed{{addr: "a:1", down: true, fails: 3}}, "", []uint64{3, 3, 4}, []bool{false, false, true}},
		{"connecting is waited for", config.Route{}, []placed{{addr: "a:1"}}, "", []uint64{0, 1}, []bool{false, false}},
		{"named peer down", config.Route{}, []placed{{addr: "a:1", node: "dec-a", down: true, fails: 1}, {addr: "b:1", sess: up}}, "dec-a",
			[]uint64{1, 2}, []bool{false, true}},
		{"pick any, one up", config.Route{Pick: config.PickAny}, []placed{{addr: "a:1", down: true, fails: 1}, {addr: "b:1", sess: up}}, "",
			[]uint64{1, 2}, []bool{false, false}},
		{"pick any, all down", config.Route{Pick: config.PickAny}, []placed{{addr: "a:1", down: true, fails: 1}, {addr: "b:1", down: true, fails: 5}}, "",
			[]uint64{1, 2}, []bool{false, false}}, // b:1 has not failed again
		{"no such peer yet", config.Route{}, []placed{{addr: "a:1", down: true}}, "dec-z", []uint64{0, 1}, []bool{false, false}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := testRoute(t, &fakeHost{}, tt.rc)
			var a *peer[*fakeSession]
			for _, pl := range tt.peers {
				p := placePeer(r, pl)
				if pl.addr == "a:1" {
					a = p
				}
			}
			var asked map[*peer[*fakeSession]]uint64
			for i, fails := range tt.fails {
				r.mu.Lock()
				a.fails = fails
				r.mu.Unlock()
				if got := r.allDown(tt.want, &asked); got != tt.got[i] {
					t.Fatalf("call %d (fails %d): got %v, want %v", i, fails, got, tt.got[i])
				}
			}
			if tt.peers[0].down && tt.want != "dec-z" && len(a.kick) != 1 {
				t.Error("a peer found down was not asked to redial")
			}
		})
	}
}

// TestPickRefusesDownPeer: a submit to a peer whose dials fail is refused
// after one more dial, long before connect_timeout, and says so.
func TestPickRefusesDownPeer(t *testing.T) {
	h := &fakeHost{dial: func(string) (*fakeSession, error) { return nil, errors.New("connection refused") }}
	tab := testTable(t, h)
	tab.add(config.Route{Name: "r", Peers: []string{"a:1"}, Stripes: 1, ConnectTimeout: 10 * time.Second})
	r, err := tab.Lookup("r")
	if err != nil {
		t.Fatal(err)
	}
	for h.dialsOf("a:1") == 0 {
		time.Sleep(time.Millisecond)
	}
	t0 := time.Now()
	_, err = r.Pick(t.Context(), "")
	if status.Code(err) != wire.CodePeerUnavailable || !strings.Contains(err.Error(), "is down") {
		t.Fatalf("Pick: got %v, want peer unavailable: down", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("refused after %v, want well before connect_timeout (10s)", d)
	}
	if n := h.dialsOf("a:1"); n < 2 {
		t.Errorf("dials: got %d, want at least 2 (one fresh dial for the submit)", n)
	}
	if got := r.stats.refusals[refuseDown].Load(); got != 1 {
		t.Errorf("peer_down refusals: got %d, want 1", got)
	}
}

func TestBackoff(t *testing.T) {
	b := Backoff{First: 50 * time.Millisecond, Max: 300 * time.Millisecond}
	for i, want := range []time.Duration{50, 100, 200, 300, 300} {
		if got := b.Next(); got != want*time.Millisecond {
			t.Fatalf("wait %d: got %v, want %v", i, got, want*time.Millisecond)
		}
	}
	b.Reset()
	if got := b.Next(); got != 50*time.Millisecond {
		t.Errorf("after Reset: got %v, want 50ms", got)
	}
}
