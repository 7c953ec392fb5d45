package proxy

import (
	"errors"
	"slices"
	"testing"

	"github.com/stage-kv/stage/config"
)

// queuedConn is a stream connection whose socket holds n bytes (or whose
// read fails with err); nothing else of it is used.
type queuedConn struct {
	streamConn
	n   uint64
	err error
}

func (c queuedConn) Queued() (uint64, error) { return c.n, c.err }

// The core's socket probe reads each attached, live stream of the session
// it names, by index, and leaves 0 for a stream missing, dead or whose
// socket cannot be read; an unknown session reads nothing.
func TestSocketBytes(t *testing.T) {
	s := &Server{sessions: newSessionTable(config.Limits{}, func(*session) {})}
	s.sender.s = s
	ss := &session{s: s, id: 7}
	dead := &dataStream{rc: queuedConn{n: 5}}
	dead.dead.Store(true)
	ss.streams.list = []*dataStream{
		{rc: queuedConn{n: 3 << 20}},
		nil,
		dead,
		{rc: queuedConn{err: errors.New("closed")}},
		{rc: queuedConn{n: 42}},
	}
	s.sessions.live[7] = ss
	got := make([]uint64, 5)
	s.sender.socketBytes(7, got)
	if want := []uint64{3 << 20, 0, 0, 0, 42}; !slices.Equal(got, want) {
		t.Fatalf("socketBytes = %v, want %v", got, want)
	}
	if slices.ContainsFunc(s.sender.sockStreams[:cap(s.sender.sockStreams)], func(ds *dataStream) bool { return ds != nil }) {
		t.Fatal("the probe's buffer keeps streams past the call")
	}
	short := make([]uint64, 2) // the core knows fewer streams than attached
	s.sender.socketBytes(7, short)
	if short[0] != 3<<20 || short[1] != 0 {
		t.Fatalf("socketBytes into 2 entries = %v", short)
	}
	none := []uint64{0, 0}
	s.sender.socketBytes(8, none)
	if none[0] != 0 || none[1] != 0 {
		t.Fatalf("an unknown session read %v", none)
	}
}
