// The peer's answers: an Ack, Nack or Resend names a transfer by wire id.
// Each session has one table of the transfers its answers may name
// (answerTable, send_answertable.go), each entry typed by the kind of
// transfer it is; the handlers look an id up once (answererOf) and the
// kind decides what the answer does.

package proxy

import (
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// answerer is the kind of transfer a wire id names, as far as the peer's
// answers are concerned. err of nack is the Nack as an error.
type answerer interface {
	ack(ss *session, m *wire.Ack, now time.Time)
	nack(ss *session, id uint64, err error, now time.Time)
	resend(ss *session, m *wire.Resend, now time.Time)
}

// The kinds. The answer table (session.out) holds *inlineXfer (our small
// push, from the moment it is sent until it is answered or fails),
// corePush (our push through the sender core, until the core retires it
// or it ended on a same-node path) and coreServed (a pull we serve, until
// the core retires it). Incoming transfers stay in the inbound half
// (session.in), the receive core's table that the chunk readers use too;
// answererOf looks the id up in both, one after the other and not under
// one lock: where one id is in both (a peer that gave one id to its push
// and to a pull it asks of us), the Nack goes to the push and the rest to
// the pull, each half's answer its own, so no answer needs both tables
// read at one instant.
var (
	_ answerer = (*inlineXfer)(nil)
	_ answerer = corePush(0)
	_ answerer = coreServed(0)
	_ answerer = inlineEnded{}
	_ answerer = incoming{}
	_ answerer = unknown{}
)

// answererOf is the kind of transfer the peer's answer names by id. Ids
// not in the table are resolved by what they were:
//   - a pull we served that retired (answerTable.retired) is still coreServed,
//     so that a late Ack reaches the core, which returns the credits it
//     still owes;
//   - one of ours whose engine transfer went on the latency path is
//     inlineEnded while that transfer is remembered (xferTable);
//   - any other id of ours is corePush: the core ignores keys it does not
//     know, and the Ack or Nack is logged as a stray;
//   - a peer's id we know nothing of is unknown (a stray).
//
// A transfer landing here (the inbound half) is incoming, which takes a Nack
// and hands Acks and Resends to the kind the id has otherwise.
func answererOf(ss *session, id uint64) answerer {
	ours := ss.ours(id)
	a := ss.out.lookup(id, !ours)
	x := ss.in.lookup(id)
	if a == nil {
		a = unknown{}
		if ours {
			a = corePush(id >> 1)
			if lx := ss.s.xfers.get(id >> 1); lx != nil && lx.inline.Load() {
				a = inlineEnded{}
			}
		}
	}
	if x != nil {
		return incoming{x: x, other: a}
	}
	return a
}

// corePush is the core key of a push of ours through the sender core.
type corePush staging.Key

func (k corePush) ack(ss *session, m *wire.Ack, now time.Time) {
	s := ss.s
	if !s.carries(ss, staging.Key(k)) {
		s.stray(ss, "Ack", m.Transfer) // the core ignores it too
	}
	s.sender.post(staging.Event{Kind: staging.EvAck, Session: ss.id, Transfer: staging.Key(k), Chunks: m.Chunks, Now: now})
}

func (k corePush) nack(ss *session, id uint64, err error, now time.Time) {
	s := ss.s
	if ss.node.Nack(id, err) { // a direct push (proxy/node)
		return
	}
	if !s.carries(ss, staging.Key(k)) {
		s.stray(ss, "Nack", id)
	}
	s.sender.post(staging.Event{Kind: staging.EvNack, Session: ss.id, Transfer: staging.Key(k), Err: err, Now: now})
}

func (k corePush) resend(ss *session, m *wire.Resend, now time.Time) {
	resendCore(ss, staging.Key(k), m, now)
}

// coreServed is the core key of a pull we serve (or served: its key
// outlives it in answerTable.retired).
type coreServed staging.Key

func (k coreServed) ack(ss *session, m *wire.Ack, now time.Time) {
	ss.s.sender.post(staging.Event{Kind: staging.EvAck, Session: ss.id, Transfer: staging.Key(k), Chunks: m.Chunks, Now: now})
}

func (k coreServed) nack(ss *session, _ uint64, err error, now time.Time) {
	ss.s.sender.post(staging.Event{Kind: staging.EvNack, Session: ss.id, Transfer: staging.Key(k), Err: nackedByPeer{err}, Now: now})
}

func (k coreServed) resend(ss *session, m *wire.Resend, now time.Time) {
	resendCore(ss, staging.Key(k), m, now)
}

// resendCore: a chunk the core sent arrived damaged. The core sends it
// again and takes back the chunk's credit.
func resendCore(ss *session, key staging.Key, m *wire.Resend, now time.Time) {
	ss.link.Resends.Add(1)
	ss.s.log.Info("peer found a chunk damaged; sending it again", zap.String("peer", ss.peerName),
		zap.Uint64("transfer", m.Transfer), zap.Uint32("chunk", m.Chunk))
	ss.s.sender.post(staging.Event{Kind: staging.EvResend, Session: ss.id, Transfer: key, Chunk: m.Chunk, Now: now})
}

// A small push of ours: its answer ends it. It takes no credit, so its
// Ack must not reach the sender core, and it is never sent again: its
// receiver answers a damaged one with a Nack, and a Resend is ignored.
func (ix *inlineXfer) ack(ss *session, m *wire.Ack, _ time.Time) {
	ss.s.inline.answered(ss, m.Transfer, nil)
}

func (ix *inlineXfer) nack(ss *session, id uint64, err error, _ time.Time) {
	ss.s.inline.answered(ss, id, err)
}

func (ix *inlineXfer) resend(*session, *wire.Resend, time.Time) {}

// inlineEnded is a small push of ours that was answered or failed: a late
// answer changes nothing, and is no stray.
type inlineEnded struct{}

func (inlineEnded) ack(*session, *wire.Ack, time.Time)       {}
func (inlineEnded) nack(*session, uint64, error, time.Time)  {}
func (inlineEnded) resend(*session, *wire.Resend, time.Time) {}

// incoming is a transfer whose chunks land here: our pull or a peer's
// push. A Nack fails it; Acks and Resends concern chunks we send, and
// go to what the id names otherwise (a peer that gave one id to both a
// push and a pull it asks of us is answered as before the table: the
// Nack fails the push, the rest reaches the pull).
type incoming struct {
	x     *inXfer
	other answerer
}

func (in incoming) ack(ss *session, m *wire.Ack, now time.Time) { in.other.ack(ss, m, now) }

func (in incoming) nack(_ *session, _ uint64, err error, _ time.Time) { in.x.fail(err, false) }

func (in incoming) resend(ss *session, m *wire.Resend, now time.Time) { in.other.resend(ss, m, now) }

// unknown is a peer's id of no transfer on this session: no credit
// (PROTOCOL 8.7), only a stray logged.
type unknown struct{}

func (unknown) ack(ss *session, m *wire.Ack, _ time.Time) { ss.s.stray(ss, "Ack", m.Transfer) }

func (unknown) nack(ss *session, id uint64, _ error, _ time.Time) { ss.s.stray(ss, "Nack", id) }

func (unknown) resend(ss *session, m *wire.Resend, _ time.Time) { ss.s.stray(ss, "Resend", m.Transfer) }

// nackedByPeer marks the failure of a pull we serve that the requester
// itself reported (its Nack): it is not answered with a Nack of ours,
// which the requester, done with the transfer, could only log as stray.
type nackedByPeer struct{ error }

func (e nackedByPeer) Unwrap() error { return e.error }
