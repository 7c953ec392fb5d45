// Tickets a peer's restart could lose. A ticket the peer's sidecar queued
// (TicketAnswer OK) waits in its inbox until the engine behind it takes
// it, a moment later; a sidecar that dies in that moment loses it, and the
// request it was for waits out its deadline and recomputes. So a sidecar
// keeps the tickets its peers queued in the last resendAge (ticketMemo),
// and when every session with a peer has closed and one comes up again
// within resendWithin, it sends those again (PROTOCOL.md 9.19). A second
// copy is the same ticket to the engines: the vLLM prefill keeps the last
// of a key, the decode finds no receive for a second failure notice,
// SGLang's decode stores a room's aux bytes once.

package proxy

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/wire"
)

const (
	// resendAge: tickets queued this long before a peer's last session
	// closed are sent again (an engine takes each within milliseconds).
	resendAge = time.Second
	// resendWithin: a peer whose session comes back later gets nothing
	// again (its engines' requests have timed out or moved on).
	resendWithin = 10 * time.Second
	// resendMax, resendBytes bound what is kept per peer.
	resendMax   = 256
	resendBytes = 4 << 20
)

type keptTicket struct {
	at time.Time
	t  wire.Ticket
}

// ticketMemo keeps, per peer name, the tickets it queued recently and,
// once its sessions closed, those that may have been lost. Its zero value
// is ready; it does no I/O.
type ticketMemo struct {
	mu   sync.Mutex
	sent map[string][]keptTicket // queued lately, oldest first
	lost map[string]lostTickets  // since the peer's sessions closed
}

type lostTickets struct {
	at    time.Time
	items []wire.Ticket
}

// pruneLocked keeps the tickets of list younger than resendAge at now,
// within resendMax and resendBytes (the newest kept).
func pruneLocked(list []keptTicket, now time.Time) []keptTicket {
	i := 0
	for i < len(list) && now.Sub(list[i].at) > resendAge {
		i++
	}
	list = list[i:]
	n := 0
	for j := len(list) - 1; j >= 0; j-- {
		n += len(list[j].t.Body)
		if len(list)-j > resendMax || n > resendBytes {
			return list[j+1:]
		}
	}
	return list
}

// queued notes that peer queued t at now.
func (m *ticketMemo) queued(peer string, t *wire.Ticket, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sent == nil {
		m.sent = map[string][]keptTicket{}
	}
	c := *t
	c.Body = append([]byte(nil), t.Body...)
	m.sent[peer] = pruneLocked(append(m.sent[peer], keptTicket{at: now, t: c}), now)
}

// closed notes that the last session with peer closed at now: what it
// queued within resendAge may be lost.
func (m *ticketMemo) closed(peer string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	list := pruneLocked(m.sent[peer], now)
	delete(m.sent, peer)
	if len(list) == 0 {
		return
	}
	items := make([]wire.Ticket, len(list))
	for i, k := range list {
		items[i] = k.t
	}
	if m.lost == nil {
		m.lost = map[string]lostTickets{}
	}
	m.lost[peer] = lostTickets{at: now, items: items}
}

// takeLost returns (once) the tickets to send peer again, whose session
// came up at now: those of its last close, if within resendWithin.
func (m *ticketMemo) takeLost(peer string, now time.Time) []wire.Ticket {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.lost[peer]
	delete(m.lost, peer)
	for p, o := range m.lost { // forget peers that never came back
		if now.Sub(o.at) > resendWithin {
			delete(m.lost, p)
		}
	}
	if !ok || now.Sub(l.at) > resendWithin {
		return nil
	}
	return l.items
}

// sessionGone notes that ss closed; when no other session with its peer
// is live, the peer's recent tickets may be lost.
func (s *Server) sessionGone(ss *session) {
	for _, o := range s.sessions.liveList() {
		if o != ss && o.peerName == ss.peerName {
			return // the peer is still there: its inboxes too
		}
	}
	s.ticketMemo.closed(ss.peerName, time.Now())
}

// resendTickets sends ss's peer again the tickets its last sessions may
// have lost, on a goroutine of its own.
func (s *Server) resendTickets(ss *session) {
	items := s.ticketMemo.takeLost(ss.peerName, time.Now())
	if len(items) == 0 {
		return
	}
	s.wg.Go(func() {
		failed := 0
		for i := range items {
			t := items[i]
			t.Seq = s.newID()
			ctx, cancel := context.WithTimeout(ss.ctx, ticketWait)
			err := askTicket(ctx, ss, &t)
			cancel()
			if err != nil {
				failed++
				s.log.Debug("ticket sent again: refused", zap.String("peer", ss.peerName), zap.String("key", t.Key), zap.Error(err))
				continue
			}
			s.ticketMemo.queued(ss.peerName, &t, time.Now())
		}
		s.log.Info("tickets sent again after the peer's sessions closed", zap.String("peer", ss.peerName),
			zap.Int("tickets", len(items)), zap.Int("refused", failed))
	})
}
