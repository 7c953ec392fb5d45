package wire

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func ticketSamples() []sample {
	body := []byte(`{"peer":"decode-0","kv":"decode","tp":1,"block_ids":[3,4],"first":0,"tokens":20}`)
	return []sample{
		{"Ticket", &Ticket{Seq: 7, Kind: TicketPush, To: "prefill", Key: "xfer-1", Body: body}},
		{"TicketFailure", &Ticket{Seq: 8, Kind: TicketFailure, Key: "xfer-2", Body: []byte("layout refused")}},
		{"TicketAux", &Ticket{Seq: 10, Kind: TicketAux, To: "dec-aux", Key: "room@0", Body: []byte{16, 1, 2, 3}}},
		{"TicketMax", &Ticket{Seq: 9, Kind: TicketPush, To: strings.Repeat("n", MaxName), Key: strings.Repeat("k", MaxTag), Body: bytes.Repeat([]byte{'1'}, MaxTicketBody)}},
		{"TicketAnswer", &TicketAnswer{Seq: 7, Code: CodeBusy, Message: "inbox prefill is full"}},
		{"TicketAnswerOK", &TicketAnswer{Seq: 8}},
		{"OpenInbox", &OpenInbox{Req: 40, Name: "prefill"}},
		{"PostTicket", &PostTicket{Req: 41, Route: "prefill", Peer: "p0", Kind: TicketPush, To: "prefill", Key: "x", Body: body}},
		{"TakeTickets", &TakeTickets{Req: 42, Max: 64, WaitMs: 500}},
		{"Tickets", &Tickets{Req: 43, Items: []TicketItem{{From: "decode-0", Kind: TicketPush, To: "prefill", Key: "x", Body: body}, {Kind: TicketFailure, Key: "y", Body: []byte("no")}}}},
		{"TicketsNone", &Tickets{Req: 44}},
	}
}

func TestTicketGolden(t *testing.T) {
	got := AppendFrame(nil, &Ticket{Seq: 0x102, Kind: TicketPush, To: "pf", Key: "x1", Body: []byte("{}")}, false, 0)
	want := hexBytes(
		"SG", 1, 25, 0, 0, 0, 0, 23, 0, 0, 0, 0, 0, 0, 0, // header: type 25, length 23
		2, 1, 0, 0, 0, 0, 0, 0, // Seq
		1,          // Kind: push
		2, 0, "pf", // To
		2, 0, "x1", // Key
		2, 0, 0, 0, "{}", // Body
	)
	if !bytes.Equal(got, want) {
		t.Fatalf("Ticket frame:\n got %x\nwant %x", got, want)
	}
	got = AppendFrame(nil, &PostTicket{Req: 5, Route: "r", Peer: "", Kind: TicketFailure, To: "d", Key: "k", Body: []byte("no")}, false, 0)
	want = hexBytes(
		"SG", 1, 155, 0, 0, 0, 0, 26, 0, 0, 0, 0, 0, 0, 0, // header: type 155, length 26
		5, 0, 0, 0, 0, 0, 0, 0, // Req
		1, 0, "r", // Route
		0, 0, // Peer
		2,         // Kind: failure
		1, 0, "d", // To
		1, 0, "k", // Key
		2, 0, 0, 0, "no", // Body
	)
	if !bytes.Equal(got, want) {
		t.Fatalf("PostTicket frame:\n got %x\nwant %x", got, want)
	}
}

func TestTicketRefused(t *testing.T) {
	over := appendBytes32(appendStr(appendStr(appendU8(appendU64(nil, 1), TicketPush), "to"), "k"), make([]byte, MaxTicketBody+1))
	badKind := (&Ticket{Seq: 1, Kind: TicketPush, Key: "k"}).AppendBody(nil)
	badKind[8] = 4
	zeroKind := (&Ticket{Seq: 1, Kind: TicketPush, Key: "k"}).AppendBody(nil)
	zeroKind[8] = 0
	many := appendU32(appendU64(nil, 1), MaxTicketsOut+1)
	for _, tc := range []struct {
		name string
		t    Type
		body []byte
		want error
		msg  string
	}{
		{"body over the limit", TypeTicket, over, ErrTooLarge, "Ticket.Body"},
		{"unknown kind", TypeTicket, badKind, ErrMalformed, "Ticket.Kind"},
		{"kind 0", TypeTicket, zeroKind, ErrMalformed, "Ticket.Kind"},
		{"too many items", TypeTickets, many, ErrTooLarge, "Tickets.Items"},
		{"items past the end", TypeTickets, appendU32(appendU64(nil, 1), 3), ErrMalformed, "Tickets.Items"},
		{"trailing", TypeOpenInbox, append((&OpenInbox{Req: 1, Name: "x"}).AppendBody(nil), 0), ErrMalformed, "OpenInbox"},
		{"short", TypeTakeTickets, []byte{1, 0, 0}, ErrMalformed, "TakeTickets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode(tc.t, tc.body)
			if m != nil || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Decode: got %v, %v; want nil and %v naming %q", m, err, tc.want, tc.msg)
			}
		})
	}
}
