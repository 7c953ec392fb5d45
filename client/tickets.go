package client

import (
	"context"
	"fmt"
	"time"

	"github.com/stage-kv/stage/wire"
)

// Tickets (PROTOCOL.md 9.19): short messages between engines behind two
// sidecars, over the sidecars' session (a decode's push ticket, a
// prefill's failure notice).

// OpenInbox makes this connection the receiver of the tickets peers
// address to name; the name is the connection's (and its group's) until
// it closes.
func (c *Client) OpenInbox(ctx context.Context, name string) error {
	req := c.next()
	_, err := c.call(ctx, req, &wire.OpenInbox{Req: req, Name: name}, -1)
	return err
}

// PostTicket sends a ticket to inbox t.To of the peer t.Peer of route
// t.Route (t.Req is set here); it returns once the peer queued it, or
// with its refusal (a full inbox: wire.CodeBusy).
func (c *Client) PostTicket(ctx context.Context, t wire.PostTicket) error {
	t.Req = c.next()
	_, err := c.call(ctx, t.Req, &t, -1)
	return err
}

// TakeTickets takes up to max tickets waiting in the inboxes of this
// connection's group, waiting up to wait for the first; none is not an
// error.
func (c *Client) TakeTickets(ctx context.Context, max int, wait time.Duration) ([]wire.TicketItem, error) {
	req := c.next()
	a, err := c.call(ctx, req, &wire.TakeTickets{Req: req, Max: uint16(min(max, wire.MaxTicketsOut)), WaitMs: uint32(wait / time.Millisecond)}, -1)
	if err != nil {
		return nil, err
	}
	r, ok := a.(*wire.Tickets)
	if !ok {
		return nil, fmt.Errorf("stage: expected Tickets, got %s", a.Type())
	}
	return r.Items, nil
}
