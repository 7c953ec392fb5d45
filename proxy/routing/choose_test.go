package routing

import (
	"errors"
	"testing"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

func TestChoose(t *testing.T) {
	a, b := newSession("dec-a", "10.0.0.1:7100"), newSession("dec-b", "10.0.0.2:7100")
	twin := newSession("dec-a", "10.0.0.3:7100")
	type want struct {
		ss      *fakeSession
		wait    bool
		code    wire.Code
		refusal int // the refusal counted, -1: none
	}
	for _, tt := range []struct {
		name  string
		rc    config.Route
		room  error
		peers []placed
		want  string
		got   want
	}{
		{"only peer up", config.Route{}, nil, []placed{{addr: "a:1", node: "dec-a", sess: a}}, "", want{ss: a, refusal: -1}},
		{"only peer connecting", config.Route{}, nil, []placed{{addr: "a:1"}}, "", want{wait: true, refusal: -1}},
		{"no peers yet", config.Route{}, nil, nil, "", want{wait: true, refusal: -1}},
		{"two peers, none named", config.Route{}, nil, []placed{{addr: "a:1", sess: a}, {addr: "b:1", sess: b}}, "",
			want{code: wire.CodeBadRequest, refusal: refuseNoPeer}},
		{"pick any takes a live one", config.Route{Pick: config.PickAny}, nil, []placed{{addr: "a:1"}, {addr: "b:1", sess: b}}, "",
			want{ss: b, refusal: -1}},
		{"pick any, none live", config.Route{Pick: config.PickAny}, nil, []placed{{addr: "a:1"}}, "", want{wait: true, refusal: -1}},
		{"by node name", config.Route{}, nil, []placed{{addr: "a:1", node: "dec-a", sess: a}, {addr: "b:1", node: "dec-b", sess: b}}, "dec-b",
			want{ss: b, refusal: -1}},
		{"by address dialed", config.Route{}, nil, []placed{{addr: "a:1", node: "dec-a", sess: a}, {addr: "b:1", node: "dec-b", sess: b}}, "a:1",
			want{ss: a, refusal: -1}},
		{"by address reached", config.Route{}, nil, []placed{{addr: "a:1", node: "dec-a", sess: a}}, "10.0.0.1:7100", want{ss: a, refusal: -1}},
		{"named peer connecting", config.Route{}, nil, []placed{{addr: "a:1", node: "dec-a"}, {addr: "b:1", sess: b}}, "dec-a",
			want{wait: true, refusal: -1}},
		{"node name of two, both up", config.Route{}, nil, []placed{{addr: "a:1", node: "dec-a", sess: a}, {addr: "c:1", node: "dec-a", sess: twin}}, "dec-a",
			want{code: wire.CodeBadRequest, refusal: refuseNoPeer}},
		{"node name of two, one up", config.Route{}, nil, []placed{{addr: "a:1", node: "dec-a"}, {addr: "c:1", node: "dec-a", sess: twin}}, "dec-a",
			want{ss: twin, refusal: -1}},
		{"unknown node name", config.Route{}, nil, []placed{{addr: "a:1", node: "dec-a", sess: a}}, "dec-z",
			want{code: wire.CodeUnknownPeer, refusal: refuseUnknown}},
		{"unknown name while a peer has none yet", config.Route{}, nil, []placed{{addr: "a:1"}}, "dec-z", want{wait: true, refusal: -1}},
		{"draining peer is not picked", config.Route{}, nil, []placed{{addr: "a:1", node: "dec-a", sess: a, draining: true}, {addr: "b:1", node: "dec-b", sess: b}}, "dec-a",
			want{code: wire.CodeUnknownPeer, refusal: refuseUnknown}},
		{"address outside allow", config.Route{Allow: []string{"10.0.0.0/8"}}, nil, nil, "192.168.1.1:7100",
			want{code: wire.CodeAccessDenied, refusal: refuseNotAllowed}},
		{"allowed address past the limits", config.Route{Allow: []string{"10.0.0.0/8"}}, status.Errorf(wire.CodeBusy, "full"), nil, "10.9.9.9:7100",
			want{code: wire.CodeBusy, refusal: refuseLimit}},
		{"allowed address is dialed", config.Route{Allow: []string{"10.0.0.0/8"}}, nil, nil, "10.9.9.9:7100", want{wait: true, refusal: -1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := &fakeHost{room: tt.room}
			r := testRoute(t, h, tt.rc)
			for _, pl := range tt.peers {
				placePeer(r, pl)
			}
			ss, ch, err := r.choose(tt.want)
			switch {
			case tt.got.code != 0:
				if err == nil || status.Code(err) != tt.got.code {
					t.Fatalf("got %v, want an error of code %v", err, tt.got.code)
				}
			case err != nil:
				t.Fatalf("got %v, want no error", err)
			case ss != tt.got.ss:
				t.Fatalf("got session %v, want %v", ss, tt.got.ss)
			case (ch != nil) != tt.got.wait:
				t.Fatalf("told to wait: got %v, want %v", ch != nil, tt.got.wait)
			}
			for i := range refuseReasons {
				want := uint64(0)
				if i == tt.got.refusal {
					want = 1
				}
				if got := r.stats.refusals[i].Load(); got != want {
					t.Errorf("refusals %s: got %d, want %d", refuseLabels[i], got, want)
				}
			}
		})
	}
}

// TestChooseDialsAllowedAddress: an allowed address becomes a dynamic
// peer, dialed at once, and the submit waits for its session.
func TestChooseDialsAllowedAddress(t *testing.T) {
	s := newSession("dec-x", "10.9.9.9:7100")
	h := &fakeHost{dial: func(string) (*fakeSession, error) { return s, nil }}
	r := testRoute(t, h, config.Route{Allow: []string{"10.0.0.0/8"}})
	got, err := r.Pick(t.Context(), "10.9.9.9:7100")
	if err != nil || got != s {
		t.Fatalf("Pick: got %v, %v; want the dialed session", got, err)
	}
	r.mu.Lock()
	p := r.peers["10.9.9.9:7100"]
	r.mu.Unlock()
	if p == nil || p.found != foundDynamic || p.node != "dec-x" {
		t.Fatalf("peer: got %+v, want a dynamic peer of node dec-x", p)
	}
	if _, err := r.PickNow("dec-x"); err != nil {
		t.Errorf("PickNow by its node name: %v", err)
	}
	s.Close(errors.New("test over"))
}
