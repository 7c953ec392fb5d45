// Tickets (PROTOCOL.md 9.19): an engine leaves a short message for an
// engine behind a peer sidecar, over the peers' authenticated session. In
// push mode a decode's scheduler posts its block table for the prefill's,
// and the prefill's posts a failure notice back when it knows at once that
// a push cannot happen. An engine connection opens an inbox (a name that
// belongs to it and its group, as a region does, until it closes); a peer's
// tickets for that name wait here, bounded in count and bytes, until one
// of the group's connections takes them. A full inbox refuses the ticket
// (CodeBusy), which the posting engine hears at once.

package proxy

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/stage-kv/stage/proxy/engine"
	"github.com/stage-kv/stage/wire"
)

// Bounds of one inbox (tickets waiting, and their bytes together) and of
// every inbox's bytes together.
const (
	inboxTickets = 1024
	inboxBytes   = 16 << 20
	inboxesBytes = 64 << 20
)

// takeBytes bounds the bodies of one Tickets answer (a frame is at most
// wire.MaxControlBody); a ticket larger alone still goes, by itself.
const takeBytes = 8 << 20

// ticketWait bounds how long a PostTicket waits for the peer's session and
// then for its answer.
const ticketWait = 5 * time.Second

// inbox is one name's queue of tickets.
type inbox struct {
	owner engine.Owner
	items []wire.TicketItem
	bytes int
}

// inboxTable holds the inboxes by name; its zero value is ready.
type inboxTable struct {
	mu     sync.Mutex
	byName map[string]*inbox
	total  int           // bytes of every inbox's tickets
	wake   chan struct{} // closed (and replaced) when a ticket arrives
	opened chan struct{} // closed (and replaced) when an inbox is opened
	// limits: inboxTickets, inboxBytes, inboxesBytes when zero (tests set them)
	maxTickets, maxBytes, maxTotal int
}

// limits are the table's bounds, the defaults where unset.
func (t *inboxTable) limits() (tickets, bytes, total int) {
	tickets, bytes, total = inboxTickets, inboxBytes, inboxesBytes
	if t.maxTickets > 0 {
		tickets = t.maxTickets
	}
	if t.maxBytes > 0 {
		bytes = t.maxBytes
	}
	if t.maxTotal > 0 {
		total = t.maxTotal
	}
	return tickets, bytes, total
}

// wakeLocked is the channel closed at the next arrival (t.mu held).
func (t *inboxTable) wakeLocked() chan struct{} {
	if t.wake == nil {
		t.wake = make(chan struct{})
	}
	return t.wake
}

// openSignal is closed at the next open of an inbox.
func (t *inboxTable) openSignal() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.opened == nil {
		t.opened = make(chan struct{})
	}
	return t.opened
}

// open gives the name to o's connection; a name another group holds is
// refused, one o's group holds already passes to o's connection.
func (t *inboxTable) open(o engine.Owner, name string) error {
	if name == "" {
		return codeErr(wire.CodeBadRequest, "an inbox needs a name (the engine's, such as its kv_name)")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.opened != nil {
		close(t.opened)
		t.opened = nil
	}
	if b := t.byName[name]; b != nil {
		if b.owner.Group != o.Group {
			return codeErr(wire.CodeExists, "inbox %q is another engine's (its connection is open); pick another name or stop that engine", name)
		}
		b.owner = o
		return nil
	}
	if t.byName == nil {
		t.byName = map[string]*inbox{}
	}
	t.byName[name] = &inbox{owner: o}
	return nil
}

// releaseConn drops the inboxes the connection conn opened, and their tickets.
func (t *inboxTable) releaseConn(conn uint64) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for name, b := range t.byName {
		if b.owner.Conn == conn {
			t.total -= b.bytes
			delete(t.byName, name)
			n++
		}
	}
	return n
}

// deliver queues a peer's ticket: into inbox m.To, or the only inbox when
// m.To is empty. It never blocks. CodeUnknownRegion means no such inbox is
// open (yet: ticketArrived waits for one).
func (t *inboxTable) deliver(from string, m *wire.Ticket) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	name := m.To
	if name == "" {
		switch len(t.byName) {
		case 0:
		case 1:
			for n := range t.byName {
				name = n
			}
		default:
			return codeErr(wire.CodeBadRequest, "ticket for %q names no inbox and this sidecar has %d: the poster must name one", m.Key, len(t.byName))
		}
	}
	b := t.byName[name]
	if b == nil {
		return codeErr(wire.CodeUnknownRegion, "no engine here takes tickets for inbox %q (is the prefill's connector running, in push mode?)", name)
	}
	maxN, maxB, maxT := t.limits()
	if len(b.items) >= maxN || b.bytes+len(m.Body) > maxB {
		return codeErr(wire.CodeBusy, "inbox %q is full (%d tickets, %d bytes waiting; at most %d and %d): its engine is not taking them", name, len(b.items), b.bytes, maxN, maxB)
	}
	if t.total+len(m.Body) > maxT {
		return codeErr(wire.CodeBusy, "this sidecar holds %d bytes of tickets, at most %d: its engines are not taking them", t.total, maxT)
	}
	b.items = append(b.items, wire.TicketItem{From: from, Kind: m.Kind, To: name, Key: m.Key, Body: m.Body})
	b.bytes += len(m.Body)
	t.total += len(m.Body)
	if t.wake != nil {
		close(t.wake)
		t.wake = nil
	}
	return nil
}

// takeNow removes up to max tickets of o's group's inboxes; wake is closed
// at the next arrival.
func (t *inboxTable) takeNow(o engine.Owner, max int) (out []wire.TicketItem, wake <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	names := make([]string, 0, len(t.byName))
	for name, b := range t.byName {
		if b.owner.Group == o.Group {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	size := 0
	for _, name := range names {
		b := t.byName[name]
		k := 0
		for k < len(b.items) && len(out) < max {
			n := len(b.items[k].Body)
			if len(out) > 0 && size+n > takeBytes {
				break
			}
			size += n
			b.bytes -= n
			t.total -= n
			out = append(out, b.items[k])
			k++
		}
		b.items = slices.Delete(b.items, 0, k)
	}
	return out, t.wakeLocked()
}

// take is takeNow, waiting up to wait (or until cancel) for the first.
func (t *inboxTable) take(o engine.Owner, max int, wait time.Duration, cancel <-chan struct{}) []wire.TicketItem {
	max = min(max, wire.MaxTicketsOut)
	if max <= 0 {
		max = wire.MaxTicketsOut
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		out, wake := t.takeNow(o, max)
		if len(out) > 0 || wait <= 0 {
			return out
		}
		select {
		case <-wake:
		case <-timer.C:
			out, _ = t.takeNow(o, max)
			return out
		case <-cancel:
			return nil
		}
	}
}

// OpenInbox opens an inbox for the connection o.
func (h engineHost) OpenInbox(o engine.Owner, m *wire.OpenInbox) error {
	return h.s.inboxes.open(o, m.Name)
}

// TakeTickets answers a TakeTickets of o.
func (h engineHost) TakeTickets(o engine.Owner, m *wire.TakeTickets, cancel <-chan struct{}) []wire.TicketItem {
	return h.s.inboxes.take(o, int(m.Max), time.Duration(m.WaitMs)*time.Millisecond, cancel)
}

// PostTicket sends a ticket to a peer's inbox and waits for its answer.
func (h engineHost) PostTicket(o engine.Owner, m *wire.PostTicket) error {
	s := h.s
	if m.Key == "" {
		return codeErr(wire.CodeBadRequest, "a ticket needs a key (the transfer it is for)")
	}
	ctx, cancel := context.WithTimeout(s.ctx, ticketWait)
	defer cancel()
	ss, err := s.ticketSession(ctx, m.Route, m.Peer)
	if err != nil {
		return err
	}
	t := &wire.Ticket{Seq: s.newID(), Kind: m.Kind, To: m.To, Key: m.Key, Body: m.Body}
	if err := askTicket(ctx, ss, t); err != nil {
		return err
	}
	s.ticketMemo.queued(ss.peerName, t, time.Now())
	return nil
}

// ticketSession is the session a ticket goes on: to peer of route, as a
// Submit's; with no route, the live session (either side dialed it) whose
// peer has node name peer, or the only one when peer is empty, so a decode
// with no route to its prefill answers the prefill on its session.
func (s *Server) ticketSession(ctx context.Context, route, peer string) (*session, error) {
	if route != "" {
		r, err := s.routes.Lookup(route)
		if err != nil {
			return nil, err
		}
		return r.Pick(ctx, peer)
	}
	var found []*session
	for _, ss := range s.sessions.liveList() {
		if peer == "" || ss.peerName == peer {
			found = append(found, ss)
		}
	}
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) == 0:
		return nil, codeErr(wire.CodeUnknownPeer, "no session with a peer named %q: name a route, or wait until the peer connected", peer)
	case peer == "":
		return nil, codeErr(wire.CodeBadRequest, "a ticket with no route and no peer, and %d peer sessions: name the peer", len(found))
	}
	return found[0], nil // several sessions to one peer (a route each way): any carries it
}

// askTicket sends t to the peer of ss and waits for its TicketAnswer.
func askTicket(ctx context.Context, ss *session, t *wire.Ticket) error {
	a, err := ask(ctx, ss, &ss.tickets, t.Seq, t)
	switch {
	case err == errAskGone:
		return codeErr(wire.CodePeerUnavailable, "session with %s closed before it answered the ticket for %q", ss.peerName, t.Key)
	case err != nil:
		return codeErr(wire.CodeTimeout, "peer %s did not answer the ticket for %q in %s", ss.peerName, t.Key, ticketWait)
	case a.Code != wire.CodeOK:
		return codeErr(a.Code, "peer %s refused the ticket for %q: %s", ss.peerName, t.Key, a.Message)
	}
	return nil
}

// answerTicket answers the peer's ticket m: queued (err nil) or refused.
func answerTicket(ss *session, m *wire.Ticket, err error) {
	a := &wire.TicketAnswer{Seq: m.Seq}
	if err != nil {
		a.Code, a.Message = errCode(err), err.Error()
	}
	ss.send(a)
}
