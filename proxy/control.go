package proxy

import (
	"time"

	"github.com/panjf2000/gnet/v2"
	"go.uber.org/zap"

	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// ctrlHandler runs peer control sessions on gnet event loops. Handlers
// decode whole frames from gnet's inbound buffer and never block: work for
// the sender goes through the mailbox, answers through AsyncWrite.
type ctrlHandler struct {
	gnet.BuiltinEventEngine
	s *Server
}

// OnOpen gives the session its connection on the event loop, before gnet
// hands over any frame: the enrolling goroutine stores it only after
// EnrollContext returns, and until then ss.send had no connection and
// dropped what it was asked to send (the Accept of a peer that announced
// a push the moment it had its Welcome; the peer then waited until the
// session died of silence).
func (h *ctrlHandler) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	if ss, _ := c.Context().(*session); ss != nil {
		ss.mu.Lock()
		ss.gc = c
		ss.mu.Unlock()
	}
	return nil, gnet.None
}

func (h *ctrlHandler) OnTraffic(c gnet.Conn) gnet.Action {
	ss, _ := c.Context().(*session)
	if ss == nil {
		return gnet.Close
	}
	ss.lastRecv.Store(time.Now().UnixNano())
	for {
		n := c.InboundBuffered()
		if n < wire.HeaderSize {
			return gnet.None
		}
		hb, err := c.Peek(wire.HeaderSize)
		if err != nil {
			return gnet.None
		}
		hdr, err := wire.ParseHeader(hb)
		if err == nil && (hdr.Type == wire.TypeChunk || hdr.Flags&wire.FlagInline != 0) {
			err = errChunkOnControl
		}
		if err != nil {
			h.s.log.Warn("bad control frame; closing session", zap.String("peer", ss.peerName), zap.Error(err))
			sendNow(c, &wire.Error{Code: wire.CodeMalformed, Message: err.Error()})
			return gnet.Close
		}
		total := wire.HeaderSize + int(hdr.Length)
		if n < total {
			return gnet.None
		}
		frame, err := c.Peek(total)
		if err != nil {
			return gnet.None
		}
		body := frame[wire.HeaderSize:]
		err = wire.VerifyCRC(hdr, body)
		var m wire.Msg
		if err == nil {
			m, err = wire.Decode(hdr.Type, body)
		}
		_, _ = c.Discard(total)
		if err != nil {
			h.s.log.Warn("bad control frame; closing session", zap.String("peer", ss.peerName), zap.Error(err))
			sendNow(c, &wire.Error{Code: wire.CodeMalformed, Message: err.Error()})
			return gnet.Close
		}
		if act := ss.handle(m); act != gnet.None {
			return act
		}
	}
}

func (h *ctrlHandler) OnClose(c gnet.Conn, err error) gnet.Action {
	if ss, _ := c.Context().(*session); ss != nil {
		if err == nil {
			err = errPeerClosed
		}
		ss.closeLater(err) // close takes locks and waits on nothing gnet needs, but keep the loop free
	}
	return gnet.None
}

// sendNow writes from inside an event-loop callback.
func sendNow(c gnet.Conn, m wire.Msg) {
	_, _ = c.Write(wire.AppendFrame(nil, m, false, 0))
}

// handle dispatches one control message of an established session.
func (ss *session) handle(m wire.Msg) gnet.Action {
	s := ss.s
	now := time.Now()
	switch m := m.(type) {
	case *wire.Ack:
		answererOf(ss, m.Transfer).ack(ss, m, now)
	case *wire.Resend:
		// A chunk we sent arrived damaged.
		answererOf(ss, m.Transfer).resend(ss, m, now)
	case *wire.Credit:
		s.sender.post(staging.Event{Kind: staging.EvCredit, Session: ss.id, Credits: int(m.Grant), Now: now})
	case *wire.Announce:
		s.acceptPush(ss, m)
	case *wire.PullRequest:
		s.servePull(ss, m)
	case *wire.KVAnnounce:
		s.acceptKVPush(ss, m)
	case *wire.KVPull:
		s.serveKVPull(ss, m)
	case *wire.KVInfoRequest:
		s.answerKVInfo(ss, m)
	case *wire.KVInfo:
		s.kv.infoAnswered(ss, m)
	case *wire.Accept:
		// Our push or pull already runs (a push does not wait for
		// Accept; a pull's chunks simply start arriving): only a Nack
		// changes anything.
	case *wire.Nack:
		// The peer refused or failed a transfer: ours, or one we serve
		// or receive.
		err := codeErr(m.Code, "peer %s: %s", ss.peerName, m.Message)
		answererOf(ss, m.Transfer).nack(ss, m.Transfer, err, time.Now())
	case *wire.CatalogRequest:
		ss.send(&wire.Catalog{Seq: m.Seq, Regions: s.regions.Infos()})
	case *wire.Catalog:
		ss.catalogs.answer(m.Seq, m.Regions)
	case *wire.Ticket:
		s.ticketArrived(ss, m)
	case *wire.TicketAnswer:
		ss.tickets.answer(m.Seq, m)
	case *wire.NodeInfo:
		ss.node.SetInfo(m)
	case *wire.Revoke:
		if err := ss.node.Revoked(m.RegionID); err != nil {
			s.log.Warn("revoke a peer region", zap.String("peer", ss.peerName), zap.Error(err))
		}
	case *wire.Heartbeat:
	case *wire.Goodbye:
		return gnet.Close
	case *wire.Error:
		s.log.Warn("peer reported an error", zap.String("peer", ss.peerName), zap.Stringer("code", m.Code), zap.String("message", m.Message))
		return gnet.Close
	default:
		s.log.Warn("unexpected control frame; closing session", zap.String("peer", ss.peerName), zap.Stringer("type", m.Type()))
		return gnet.Close
	}
	return gnet.None
}

// stray logs, once per session and frame type, a peer's Ack or Nack that
// names a transfer not in flight on its session. A late answer to a
// transfer that already failed looks the same as a forged one; either way
// nothing changes, but a peer that forges them shows in the log.
func (s *Server) stray(ss *session, frame string, id uint64) {
	if ss.node.LogOnce("stray " + frame) {
		s.log.Warn("peer answered a transfer that is not in flight on its session; ignored (logged once per session)",
			zap.String("peer", ss.peerName), zap.String("frame", frame), zap.Uint64("transfer", id))
	}
}

// carries reports whether our transfer key is an outgoing transfer on ss.
func (s *Server) carries(ss *session, key staging.Key) bool {
	ox := s.outs.get(key)
	return ox != nil && ox.ss == ss
}
