package wire

// A Submit in pieces (PROTOCOL.md 9.5b): an engine sends the first piece
// as a Submit or SubmitWait with FlagMore in its header (its body is a
// whole Submit's, with the first ops), then the rest of the ops in
// SubmitMore frames with the same Req, the last with End set. The sidecar
// checks each piece as it arrives, so a large op list is decoded and
// checked while the engine still encodes and writes the rest.

// TypeSubmitMore carries the next ops of a Submit sent in pieces.
const TypeSubmitMore Type = 160

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
	typeNames[TypeSubmitMore] = "SubmitMore"
	knownTypes[TypeSubmitMore] = true
}

// SubmitMore is the next piece of request Req's ops. Ops index the first
// piece's LocalNames and RemoteNames (the sidecar checks that; the decoder
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
	return Features{SubmitPieces: &PiecesLimits{MaxPieces: MaxSubmitPieces, MaxOps: MaxOps, RestMs: SubmitRestMs, MaxOpen: SubmitOpenMax}}
}
