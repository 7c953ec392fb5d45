package proxy

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stage-kv/stage/proxy/node"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// answerSession is a session we dialed (our wire ids are odd, the peer's
// even) whose server records what the sender core is told and logs to
// logs; nothing is sent.
func answerSession(t *testing.T) (*session, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	s := &Server{log: zap.New(core), sender: sender{mbox: newMailbox()}, xfers: newXferTable(), outs: newOutTable()}
	s.metrics = newMetrics(s)
	s.inline.s = s
	ss := testSession(true)
	ss.s, ss.link, ss.peerName = s, &counters{}, "peer"
	ss.node = (*node.Room)(nil).NewPeer(nil)
	ss.sent = func(wire.Msg) {}
	return ss, logs
}

// The transfers the tests put on an answer session, by wire id.
const (
	idPush     = 11 // our push through the core, key 5
	idInline   = 15 // our small push, engine id 7
	idPull     = 13 // our pull, engine id 6
	idServed   = 4  // a pull we serve, key 100
	idIncoming = 6  // a peer's push
	idUnknown  = 8  // nothing
)

// answeredXfer is an engine's transfer with id on ss, running.
func answeredXfer(ss *session, id uint64, dir wire.Direction) *localXfer {
	lx := &localXfer{id: id, wireID: ss.wireID(id), dir: dir, total: 8, ss: ss, state: wire.StateRunning,
		started: time.Now(), done: make(chan struct{})}
	ss.s.xfers.add(lx)
	return lx
}

// Each kind of transfer a wire id names gets the answers meant for it:
// which events reach the sender core, what is logged as stray, and what
// ends an engine's transfer.
func TestAnswerDispatch(t *testing.T) {
	ack := func(id uint64) wire.Msg { return &wire.Ack{Transfer: id, Chunks: []uint32{0}} }
	nack := func(id uint64) wire.Msg { return &wire.Nack{Transfer: id, Code: wire.CodeBusy, Message: "no"} }
	resend := func(id uint64) wire.Msg { return &wire.Resend{Transfer: id, Chunk: 0} }

	// Set-ups; each returns the engine transfer the answer may end (nil: none).
	push := func(ss *session) *localXfer { // live: in the out table and the answer table
		lx := answeredXfer(ss, 5, wire.Push)
		ss.s.outs.put(&outXfer{key: 5, wireID: idPush, ss: ss, end: ourPush{lx}})
		ss.out.expect(idPush, corePush(5))
		return nil
	}
	direct := func(ss *session) *localXfer { push(ss); ss.node.WatchNacks(idPush); return nil }
	retiredPush := func(ss *session) *localXfer { answeredXfer(ss, 5, wire.Push); return nil }
	inline := func(ss *session) *localXfer {
		lx := answeredXfer(ss, 7, wire.Push)
		lx.inline.Store(true)
		ss.out.expect(idInline, &inlineXfer{lx: lx})
		return lx
	}
	inlineEnded := func(ss *session) *localXfer {
		lx := answeredXfer(ss, 7, wire.Push)
		lx.inline.Store(true)
		ss.s.finishLocal(lx, nil)
		return nil
	}
	pull := func(ss *session) *localXfer {
		lx := answeredXfer(ss, 6, wire.Pull)
		if err := ss.in.open(&inXfer{s: ss.s, ss: ss, wireID: idPull, total: 8, dest: byteDest{}, end: ourPull{lx}}); err != nil {
			t.Fatal(err)
		}
		return lx
	}
	served := func(ss *session) *localXfer { ss.out.expect(idServed, coreServed(100)); return nil }
	retiredServed := func(ss *session) *localXfer {
		ss.out.retire(idServed, 100)
		return nil
	}
	peersPush := func(ss *session) *localXfer {
		if err := ss.in.open(&inXfer{s: ss.s, ss: ss, wireID: idIncoming, end: peerPush{}, total: 8, dest: byteDest{}}); err != nil {
			t.Fatal(err)
		}
		return nil
	}
	nothing := func(*session) *localXfer { return nil }

	for _, tc := range []struct {
		name  string
		setup func(*session) *localXfer
		msg   wire.Msg
		core  string     // what the sender core hears ("" nothing)
		stray bool       // logged as a stray
		state wire.State // of the set-up's engine transfer
	}{
		{"our push: Ack", push, ack(idPush), "ack 5", false, 0},
		{"our push: Nack", push, nack(idPush), "nack 5", false, 0},
		{"our push: Resend", push, resend(idPush), "resend 5", false, 0},
		{"our direct push: Nack to proxy/node", direct, nack(idPush), "", false, 0},
		{"our direct push: Ack", direct, ack(idPush), "ack 5", false, 0},
		{"our retired push: late Ack", retiredPush, ack(idPush), "ack 5", true, 0},
		{"our retired push: late Nack", retiredPush, nack(idPush), "nack 5", true, 0},
		{"our retired push: late Resend", retiredPush, resend(idPush), "resend 5", false, 0},
		{"our small push: Ack ends it", inline, ack(idInline), "", false, wire.StateDone},
		{"our small push: Nack fails it", inline, nack(idInline), "", false, wire.StateFailed},
		{"our small push: Resend ignored", inline, resend(idInline), "", false, wire.StateRunning},
		{"our small push ended: late Ack", inlineEnded, ack(idInline), "", false, 0},
		{"our small push ended: late Nack", inlineEnded, nack(idInline), "", false, 0},
		{"our pull: Nack fails it", pull, nack(idPull), "", false, wire.StateFailed},
		{"our pull: Ack reaches the core as ours", pull, ack(idPull), "ack 6", true, wire.StateRunning},
		{"our pull: Resend reaches the core as ours", pull, resend(idPull), "resend 6", false, wire.StateRunning},
		{"pull we serve: Ack", served, ack(idServed), "ack 100", false, 0},
		{"pull we serve: Nack, the peer's own", served, nack(idServed), "nack-by-peer 100", false, 0},
		{"pull we serve: Resend", served, resend(idServed), "resend 100", false, 0},
		{"pull we served, retired: late Ack returns credits", retiredServed, ack(idServed), "ack 100", false, 0},
		{"pull we served, retired: late Nack", retiredServed, nack(idServed), "nack-by-peer 100", false, 0},
		{"peer's push: Ack is stray", peersPush, ack(idIncoming), "", true, 0},
		{"peer's push: Resend is stray", peersPush, resend(idIncoming), "", true, 0},
		{"unknown: Ack is stray", nothing, ack(idUnknown), "", true, 0},
		{"unknown: Nack is stray", nothing, nack(idUnknown), "", true, 0},
		{"unknown: Resend is stray", nothing, resend(idUnknown), "", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss, logs := answerSession(t)
			lx := tc.setup(ss)
			ss.handle(tc.msg)
			var core []string
			for _, ev := range ss.s.sender.mbox.take() {
				core = append(core, eventString(ev))
			}
			if want := []string{tc.core}; tc.core == "" && len(core) > 0 || tc.core != "" && fmt.Sprint(core) != fmt.Sprint(want) {
				t.Errorf("core heard %q, want %q", core, tc.core)
			}
			if got := logs.FilterMessageSnippet("not in flight").Len() > 0; got != tc.stray {
				t.Errorf("stray logged: %v, want %v", got, tc.stray)
			}
			if lx != nil {
				if st := lx.status(0).State; st != tc.state {
					t.Errorf("engine transfer %v, want %v", st, tc.state)
				}
			}
		})
	}
}

func eventString(ev staging.Event) string {
	switch ev.Kind {
	case staging.EvAck:
		return fmt.Sprint("ack ", ev.Transfer)
	case staging.EvResend:
		return fmt.Sprint("resend ", ev.Transfer)
	case staging.EvNack:
		var p nackedByPeer
		if errors.As(ev.Err, &p) {
			return fmt.Sprint("nack-by-peer ", ev.Transfer)
		}
		return fmt.Sprint("nack ", ev.Transfer)
	}
	return fmt.Sprint("event ", ev.Kind)
}

// The kind each wire id resolves to, including ids no longer (or never)
// in the table.
func TestAnswererOf(t *testing.T) {
	ss, _ := answerSession(t)
	lx := answeredXfer(ss, 7, wire.Push) // our small push, answered
	lx.inline.Store(true)
	ss.s.finishLocal(lx, nil)
	ix := &inlineXfer{lx: answeredXfer(ss, 9, wire.Push)} // our small push, waiting
	ix.lx.inline.Store(true)
	ss.out.expect(ix.lx.wireID, ix)
	ss.out.expect(idPush, corePush(5))
	ss.out.expect(idServed, coreServed(100))
	ss.out.retire(10, 200)
	pull := &inXfer{s: ss.s, ss: ss, wireID: idPull, total: 8, dest: byteDest{}, end: ourPull{answeredXfer(ss, 6, wire.Pull)}}
	in := &inXfer{s: ss.s, ss: ss, wireID: idIncoming, end: peerPush{}, total: 8, dest: byteDest{}}
	forged := &inXfer{s: ss.s, ss: ss, wireID: idServed, end: peerPush{}, total: 8, dest: byteDest{}} // a push under a served pull's id
	for _, x := range []*inXfer{pull, in, forged} {
		if err := ss.in.open(x); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		id   uint64
		want answerer
	}{
		{ix.lx.wireID, ix},
		{idInline, inlineEnded{}},
		{17, corePush(8)}, // ours, never seen: the core ignores it
		{idPush, corePush(5)},
		{idPull, incoming{pull, corePush(6)}},
		{idServed, incoming{forged, coreServed(100)}},
		{10, coreServed(200)},
		{idIncoming, incoming{in, unknown{}}},
		{idUnknown, unknown{}},
	} {
		if got := answererOf(ss, tc.id); got != tc.want {
			t.Errorf("answererOf(%d) = %#v, want %#v", tc.id, got, tc.want)
		}
	}
	ss.out.forget(idPush, corePush(4)) // not what is listed: stays
	ss.out.forget(idServed, coreServed(100))
	push := ss.out.lookup(idPush, false) != nil
	served := ss.out.lookup(idServed, false) != nil
	if !push || served {
		t.Errorf("after forget: push listed %v (want true), served listed %v (want false)", push, served)
	}
}

// Retiring a transfer takes its id out of the answer table; a served
// pull's key stays reachable (answerTable.retired), an id of ours resolves
// as before.
func TestRetireForgetsAnswers(t *testing.T) {
	ss, _ := answerSession(t)
	lx := answeredXfer(ss, 5, wire.Push)
	ss.s.outs.put(&outXfer{key: 5, wireID: idPush, ss: ss, end: ourPush{lx}})
	ss.out.expect(idPush, corePush(5))
	ss.s.outs.put(&outXfer{key: 100, wireID: idServed, ss: ss, end: servedPull{}})
	ss.out.expect(idServed, coreServed(100))
	ss.s.retire(5)
	ss.s.retire(100)
	ss.out.mu.Lock()
	n := len(ss.out.byID)
	ss.out.mu.Unlock()
	if n != 0 {
		t.Errorf("%d ids still listed after retire, want 0", n)
	}
	for _, tc := range []struct {
		id   uint64
		want answerer
	}{{idPush, corePush(5)}, {idServed, coreServed(100)}} {
		if got := answererOf(ss, tc.id); got != tc.want {
			t.Errorf("answererOf(%d) after retire = %#v, want %#v", tc.id, got, tc.want)
		}
	}
	if ss.s.outs.len() != 0 {
		t.Errorf("out table holds %d after retire, want 0", ss.s.outs.len())
	}
}
