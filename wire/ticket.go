package wire

// Tickets (PROTOCOL.md 9.19): small messages one engine leaves for another
// engine behind a peer sidecar, carried over the peers' authenticated
// session. In push mode the decode's scheduler posts a ticket (its block
// ids, as JSON) for the prefill's; the prefill's posts back a failure
// notice when it already knows a push cannot happen. An engine connection
// opens an inbox (a name, owned by the connection and its group like a
// region); a peer's tickets for that name wait in the sidecar, bounded,
// until the connection takes them.

// Frame types of tickets.
const (
	TypeTicket       Type = 25  // peer: a ticket for one of the receiver's inboxes
	TypeTicketAnswer Type = 26  // peer: the ticket was queued (Code 0) or refused
	TypeOpenInbox    Type = 154 // local: take tickets addressed to Name
	TypePostTicket   Type = 155 // local: send a ticket to a peer's inbox
	TypeTakeTickets  Type = 156 // local: the tickets waiting in this connection's inboxes
	TypeTickets      Type = 157 // local: the answer to TakeTickets
)

// Limits of tickets.
const (
	MaxTicketBody = 256 << 10 // bytes of one ticket's body (a JSON block table of ~30,000 blocks)
	MaxTicketsOut = 256       // tickets in one Tickets answer
)

// Ticket kinds.
const (
	TicketPush    uint8 = 1 // the body says where to push (a decode's block table)
	TicketFailure uint8 = 2 // the body says why the transfer of Key cannot happen
	TicketAux     uint8 = 3 // the body is bytes the receiving engine stores (SGLang's aux metadata of a request)
)

// TicketKinds are the kinds this build takes, for Features.
var TicketKinds = []int{int(TicketPush), int(TicketFailure), int(TicketAux)}

func init() {
	for t, n := range map[Type]string{TypeTicket: "Ticket", TypeTicketAnswer: "TicketAnswer",
		TypeOpenInbox: "OpenInbox", TypePostTicket: "PostTicket", TypeTakeTickets: "TakeTickets",
		TypeTickets: "Tickets"} {
		typeNames[t] = n
		knownTypes[t] = true
	}
}

// Ticket (peer) carries one ticket for the receiver's inbox To ("" : its
// only inbox), under the transfer key Key. Seq pairs it with its
// TicketAnswer.
type Ticket struct {
	Seq  uint64
	Kind uint8
	To   string
	Key  string
	Body []byte
}

// TicketAnswer (peer) says whether the Ticket of Seq was queued.
type TicketAnswer struct {
	Seq     uint64
	Code    Code
	Message string
}

// OpenInbox (local) makes the connection the receiver of the tickets that
// peers address to Name; answered OK, or Fail when another connection's
// group holds the name.
type OpenInbox struct {
	Req  uint64
	Name string
}

// PostTicket (local) sends a ticket to inbox To of peer Peer of route
// Route; answered OK once the peer queued it, Fail when it refused it
// (full: CodeBusy) or could not be reached.
type PostTicket struct {
	Req   uint64
	Route string
	Peer  string
	Kind  uint8
	To    string
	Key   string
	Body  []byte
}

// TakeTickets (local) asks for up to Max tickets waiting in the
// connection's inboxes, waiting up to WaitMs for the first; answered
// Tickets (maybe none).
type TakeTickets struct {
	Req    uint64
	Max    uint16
	WaitMs uint32
}

// TicketItem is one delivered ticket: From is the peer sidecar's node
// name, To the inbox it was addressed to.
type TicketItem struct {
	From string
	Kind uint8
	To   string
	Key  string
	Body []byte
}

// Tickets (local) answers TakeTickets.
type Tickets struct {
	Req   uint64
	Items []TicketItem
}

func (*Ticket) Type() Type       { return TypeTicket }
func (*TicketAnswer) Type() Type { return TypeTicketAnswer }
func (*OpenInbox) Type() Type    { return TypeOpenInbox }
func (*PostTicket) Type() Type   { return TypePostTicket }
func (*TakeTickets) Type() Type  { return TypeTakeTickets }
func (*Tickets) Type() Type      { return TypeTickets }

// AppendBody appends the encoded Ticket body to dst.
func (m *Ticket) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Seq)
	dst = appendU8(dst, m.Kind)
	dst = appendStr(dst, m.To)
	dst = appendStr(dst, m.Key)
	return appendBytes32(dst, m.Body)
}

func (m *Ticket) decode(d *decoder) {
	m.Seq = d.u64("Seq")
	m.Kind = d.ticketKind("Kind")
	m.To = d.str("To", MaxName)
	m.Key = d.str("Key", MaxTag)
	m.Body = d.bytes32("Body", MaxTicketBody)
}

// AppendBody appends the encoded TicketAnswer body to dst.
func (m *TicketAnswer) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Seq)
	dst = appendU16(dst, uint16(m.Code))
	return appendText(dst, m.Message)
}

func (m *TicketAnswer) decode(d *decoder) {
	m.Seq = d.u64("Seq")
	m.Code = Code(d.u16("Code"))
	m.Message = d.str("Message", MaxMessage)
}

// AppendBody appends the encoded OpenInbox body to dst.
func (m *OpenInbox) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	return appendStr(dst, m.Name)
}

func (m *OpenInbox) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Name = d.str("Name", MaxName)
}

// AppendBody appends the encoded PostTicket body to dst.
func (m *PostTicket) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	dst = appendStr(dst, m.Route)
	dst = appendStr(dst, m.Peer)
	dst = appendU8(dst, m.Kind)
	dst = appendStr(dst, m.To)
	dst = appendStr(dst, m.Key)
	return appendBytes32(dst, m.Body)
}

func (m *PostTicket) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Route = d.str("Route", MaxName)
	m.Peer = d.str("Peer", MaxName)
	m.Kind = d.ticketKind("Kind")
	m.To = d.str("To", MaxName)
	m.Key = d.str("Key", MaxTag)
	m.Body = d.bytes32("Body", MaxTicketBody)
}

// AppendBody appends the encoded TakeTickets body to dst.
func (m *TakeTickets) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	dst = appendU16(dst, m.Max)
	return appendU32(dst, m.WaitMs)
}

func (m *TakeTickets) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Max = d.u16("Max")
	m.WaitMs = d.u32("WaitMs")
}

// AppendBody appends the encoded Tickets body to dst.
func (m *Tickets) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	n := min(len(m.Items), MaxTicketsOut)
	dst = appendU32(dst, uint32(n))
	for _, it := range m.Items[:n] {
		dst = appendStr(dst, it.From)
		dst = appendU8(dst, it.Kind)
		dst = appendStr(dst, it.To)
		dst = appendStr(dst, it.Key)
		dst = appendBytes32(dst, it.Body)
	}
	return dst
}

// minTicketItem is the smallest encoded TicketItem: three empty strings,
// the kind and an empty body.
const minTicketItem = 2 + 1 + 2 + 2 + 4

func (m *Tickets) decode(d *decoder) {
	m.Req = d.u64("Req")
	n := d.count("Items", MaxTicketsOut, minTicketItem)
	if n == 0 {
		return
	}
	m.Items = make([]TicketItem, n)
	for i := range m.Items {
		d.idx = i
		it := &m.Items[i]
		it.From = d.str("Items[].From", MaxName)
		it.Kind = d.ticketKind("Items[].Kind")
		it.To = d.str("Items[].To", MaxName)
		it.Key = d.str("Items[].Key", MaxTag)
		it.Body = d.bytes32("Items[].Body", MaxTicketBody)
		if d.err != nil {
			m.Items = nil
			return
		}
	}
}

// ticketKind reads a ticket kind: TicketPush, TicketFailure or TicketAux.
func (d *decoder) ticketKind(field string) uint8 {
	k := d.u8(field)
	if d.err == nil && (k < TicketPush || k > TicketAux) {
		d.fail(ErrMalformed, field, "ticket kind %d (1: push, 2: failure, 3: aux)", k)
	}
	return k
}

// decodeTicketMsg is decodeMsg for the ticket frames, then Join (decodeJoin).
func decodeTicketMsg(t Type, d *decoder) Msg {
	switch t {
	case TypeTicket:
		m := new(Ticket)
		m.decode(d)
		return m
	case TypeTicketAnswer:
		m := new(TicketAnswer)
		m.decode(d)
		return m
	case TypeOpenInbox:
		m := new(OpenInbox)
		m.decode(d)
		return m
	case TypePostTicket:
		m := new(PostTicket)
		m.decode(d)
		return m
	case TypeTakeTickets:
		m := new(TakeTickets)
		m.decode(d)
		return m
	case TypeTickets:
		m := new(Tickets)
		m.decode(d)
		return m
	}
	return decodeGrant(t, d)
}
