package proxy

import (
	"strings"
	"testing"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/wire"
)

// tableSession is a session as the sessions table counts it: a dialed one
// has its stripes' streams, an accepted one the streams attached so far.
func tableSession(id uint64, dialer bool, streams int) *session {
	ss := &session{id: id, dialer: dialer}
	ss.streams.list = make([]*dataStream, streams)
	if !dialer {
		ss.streams.stripes = streams
	}
	ss.sid[0] = byte(id)
	return ss
}

func TestSessionTableLimits(t *testing.T) {
	for _, tt := range []struct {
		name      string
		sessions  []*session
		dialing   int // stripes of one session being dialed; 0: none
		stripes   int
		want      string // "" when there is room
		wantOffer int    // streamOffer(64)
	}{
		{"empty", nil, 0, 4, "", 16},
		{"streams fit", []*session{tableSession(1, true, 4), tableSession(2, false, 8)}, 0, 4, "", 4},
		{"streams full", []*session{tableSession(1, true, 4), tableSession(2, false, 8)}, 0, 5, "max_streams", 4},
		{"dialing counted", []*session{tableSession(1, true, 4)}, 8, 5, "max_streams", 12},
		{"sessions full", []*session{tableSession(1, true, 1), tableSession(2, false, 1)}, 1, 1, "max_sessions", 14},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tab := newSessionTable(config.Limits{MaxSessions: 3, MaxStreams: 16}, func(*session) {})
			for _, ss := range tt.sessions {
				if err := tab.promote(ss); err != nil {
					t.Fatal(err)
				}
			}
			if tt.dialing > 0 {
				if err := tab.reserve(tt.dialing); err != nil {
					t.Fatal(err)
				}
			}
			err := tab.room(tt.stripes)
			if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("room(%d): got %v, want %q", tt.stripes, err, tt.want)
			}
			if err != nil && errCode(err) != wire.CodeBusy {
				t.Errorf("room: code %v, want busy", errCode(err))
			}
			if got := tab.streamOffer(64); got != tt.wantOffer {
				t.Errorf("streamOffer(64): got %d, want %d", got, tt.wantOffer)
			}
			if tt.dialing > 0 {
				tab.release(tt.dialing)
				if tab.dialSessions != 0 || tab.dialStreams != 0 {
					t.Errorf("after release: %d sessions, %d streams being dialed", tab.dialSessions, tab.dialStreams)
				}
			}
		})
	}
}

func TestSessionTableLifecycle(t *testing.T) {
	var ups []uint64
	tab := newSessionTable(config.Limits{MaxSessions: 8, MaxStreams: 64}, func(ss *session) { ups = append(ups, ss.id) })
	acc, dial := tableSession(1, false, 2), tableSession(2, true, 2)
	if err := tab.enlist(acc); err != nil {
		t.Fatal(err)
	}
	if tab.accepted(acc.sid) != acc || len(tab.liveList()) != 0 || tab.count() != 1 {
		t.Fatal("an enlisted session: accepted must find it, liveList must not")
	}
	for _, ss := range []*session{acc, dial} {
		if err := tab.promote(ss); err != nil {
			t.Fatal(err)
		}
	}
	// The core hears of each session once: an accepted one at enlist.
	if len(ups) != 2 || ups[0] != 1 || ups[1] != 2 {
		t.Errorf("sessions the core heard of: got %v, want [1 2]", ups)
	}
	if tab.accepted(dial.sid) != nil {
		t.Error("accepted found a session we dialed")
	}
	tab.remove(acc)
	if tab.accepted(acc.sid) != nil || tab.count() != 1 {
		t.Error("a removed session is still found")
	}
	if all := tab.closeAll(); len(all) != 1 || all[0] != dial {
		t.Errorf("closeAll: got %d sessions, want the dialed one", len(all))
	}
	if err := tab.enlist(tableSession(3, false, 1)); err != errShuttingDown {
		t.Errorf("enlist after closeAll: got %v, want %v", err, errShuttingDown)
	}
	if err := tab.promote(tableSession(4, true, 1)); err != errShuttingDown {
		t.Errorf("promote after closeAll: got %v, want %v", err, errShuttingDown)
	}
}
