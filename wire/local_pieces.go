package wire

// A Submit in pieces (PROTOCOL.md 9.5b): an engine sends the first piece
// as a SubmitHead (a Submit's fields, the first ops, and what the whole
// op list adds up to: Total bytes and, per remote region, the highest
// offset + length it reaches), then the rest of the ops in SubmitMore
// frames with the same Req, the last with End set. The sidecar checks
// each piece as it arrives and, for a push, announces the transfer and
// gathers its first chunks while the engine still encodes and writes the
// rest.

// Frames of a Submit in pieces.
const (
	TypeSubmitMore Type = 160 // the next ops of a request started by SubmitHead
	TypeSubmitHead Type = 161 // the first piece: a Submit with the totals of all its pieces
)

// QueryFeatures asks which optional requests the sidecar takes (Features);
// a sidecar that predates it answers Fail BadRequest ("unknown query").
const QueryFeatures uint8 = 6

// Limits of a Submit in pieces.
const (
	// MaxSubmitPieces is the most pieces of one request, the first
	// (Submit with FlagMore) and the last (End) included.
	MaxSubmitPieces = 4096
	// SubmitRestMs is how long the sidecar waits for a request's End
	// after its first piece (milliseconds); then it fails it (Timeout).
	SubmitRestMs = 10_000
	// SubmitOpenMax is the most requests in pieces one connection may have
	// open (first piece sent, End not yet) at once.
	SubmitOpenMax = 16
)

func init() {
	typeNames[TypeSubmitMore], typeNames[TypeSubmitHead] = "SubmitMore", "SubmitHead"
	knownTypes[TypeSubmitMore], knownTypes[TypeSubmitHead] = true, true
}

// SubmitHead is the first piece of a Submit sent in pieces: Submit's
// fields with the first ops (Peer, optional, last as in Submit), and what
// all pieces' ops will add up to. Wait asks for SubmitWait's answer (the
// final XferStatus) instead of Submitted. Ends has one entry per
// RemoteNames: no op of any piece may reach past Ends[op.Remote] (offset
// + length), and the ops of all pieces must add up to exactly Total.
type SubmitHead struct {
	Submit
	Wait  bool
	Total uint64
	Ends  []uint64
}

func (*SubmitHead) Type() Type { return TypeSubmitHead }

// AppendBody appends the encoded SubmitHead body to dst: Req, Wait, Total,
// Ends, then the rest of a Submit body.
func (m *SubmitHead) AppendBody(dst []byte) []byte {
	n := listLen(len(m.Ends))
	need := m.headSize() + 1 + 8 + 4 + 8*n + 4 + listLen(len(m.Ops))*localOpSize
	if m.Peer != "" {
		need += strSize(m.Peer)
	}
	dst = grow(dst, need)
	dst = appendU64(dst, m.Req)
	dst = appendBool(dst, m.Wait)
	dst = appendU64(dst, m.Total)
	dst = appendU32(dst, uint32(n))
	for _, e := range m.Ends[:n] {
		dst = appendU64(dst, e)
	}
	return m.appendRest(dst)
}

func (m *SubmitHead) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Wait = d.boolean("Wait")
	m.Total = d.u64("Total")
	if n := d.count("Ends", MaxNames, 8); d.err == nil && n > 0 {
		m.Ends = make([]uint64, n)
		for i := range m.Ends {
			m.Ends[i] = d.u64("Ends[]")
		}
	}
	m.decodeRest(d)
	if d.err == nil && len(m.Ends) != len(m.RemoteNames) {
		d.fail(ErrMalformed, "Ends", "count %d, want %d (one per remote name)", len(m.Ends), len(m.RemoteNames))
	}
	if d.err == nil && m.Total == 0 {
		d.fail(ErrMalformed, "Total", "zero (a transfer moves at least one byte)")
	}
}

// SubmitMore is the next piece of request Req's ops. Ops index the
// SubmitHead's LocalNames and RemoteNames (the sidecar checks that; the decoder
// cannot). End marks the last piece: the sidecar starts the transfer whole
// once it has it, and answers the request as it would have answered one
// Submit.
type SubmitMore struct {
	Req uint64
	End bool
	Ops []LocalOp
}

func (*SubmitMore) Type() Type { return TypeSubmitMore }

// AppendBody appends the encoded SubmitMore body to dst, growing it once.
func (m *SubmitMore) AppendBody(dst []byte) []byte {
	dst = grow(dst, 8+1+4+listLen(len(m.Ops))*localOpSize)
	dst = appendU64(dst, m.Req)
	dst = appendBool(dst, m.End)
	return appendLocalOps(dst, m.Ops)
}

func (m *SubmitMore) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.End = d.boolean("End")
	// No names here: only lengths and overflow are checked now.
	m.Ops = decodeLocalOps(d, 1<<32, 1<<32)
}

// Features answers QueryFeatures (JSON): the optional requests this
// sidecar takes, each with its limits. A feature left out is not taken.
type Features struct {
	SubmitPieces *PiecesLimits `json:"submit_pieces,omitempty"`
	// TicketKinds are the ticket kinds (9.19) the sidecar carries; one
	// that predates the list carries 1 and 2 only.
	TicketKinds []int `json:"ticket_kinds,omitempty"`
}

// PiecesLimits are the limits of a Submit in pieces.
type PiecesLimits struct {
	MaxPieces int `json:"max_pieces"` // pieces of one request, first and last included
	MaxOps    int `json:"max_ops"`    // ops of one request, all pieces together
	RestMs    int `json:"rest_ms"`    // the End must come this long after the first piece
	MaxOpen   int `json:"max_open"`   // requests in pieces open at once on one connection
}

// OurFeatures is what this build's sidecar answers to QueryFeatures.
func OurFeatures() Features {
	return Features{SubmitPieces: &PiecesLimits{MaxPieces: MaxSubmitPieces, MaxOps: MaxOps, RestMs: SubmitRestMs, MaxOpen: SubmitOpenMax},
		TicketKinds: TicketKinds}
}
