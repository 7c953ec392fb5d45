package wire

// NonceSize and ProofSize: random per-session nonces and HMAC-SHA256 proofs.
const (
	NonceSize     = 32
	ProofSize     = 32
	SessionIDSize = 16
)

// Hello opens a control session (client -> server).
type Hello struct {
	VersionMin, VersionMax uint8
	NodeName               string // the client's node name
	HostID                 string // host identity (same-node detection)
	Nonce                  [NonceSize]byte
	SlotSize               uint32 // the client's largest chunk payload
	Window                 uint32 // credits the client grants the server
}

// Challenge answers Hello (server -> client).
type Challenge struct {
	Version  uint8 // chosen version
	NodeName string
	HostID   string
	Nonce    [NonceSize]byte
	Proof    [ProofSize]byte // HMAC(token, "stage-server" | client nonce | server nonce)
}

// Auth proves the client knows the token (client -> server).
type Auth struct {
	Proof [ProofSize]byte // HMAC(token, "stage-client" | client nonce | server nonce)
}

// Welcome establishes the session (server -> client).
type Welcome struct {
	SessionID  [SessionIDSize]byte
	SlotSize   uint32 // the server's largest chunk payload
	Window     uint32 // credits the server grants the client
	MaxStreams uint16 // data streams the server accepts per session
}

// DataHello opens a data stream of an established session (client -> server).
type DataHello struct {
	SessionID [SessionIDSize]byte
	Stream    uint16
	Proof     [ProofSize]byte // HMAC(token, "stage-data" | session id | stream | client nonce | server nonce)
}

// DataAccept accepts a data stream (server -> client).
type DataAccept struct {
	Stream uint16
}

// CatalogRequest asks for the peer's regions.
type CatalogRequest struct {
	Seq uint64
}

// RegionInfo describes one region in a Catalog.
type RegionInfo struct {
	Name   string `json:"name"`
	Size   uint64 `json:"size"`
	Access Access `json:"access"`
	Device string `json:"device"` // e.g. "hostmem:0", "cuda:1"
}

// Catalog lists regions (answer to CatalogRequest with the same Seq).
type Catalog struct {
	Seq     uint64
	Regions []RegionInfo
}

// Announce starts a push: the sender names the receiver's regions the chunks
// will land in (chunk segments index Regions).
type Announce struct {
	Transfer uint64
	Tag      string
	Total    uint64 // bytes
	Regions  []string
	// Ends[i] is the highest end offset (offset+length) the transfer
	// writes in Regions[i], so the receiver can refuse an out-of-range
	// transfer before any byte lands. Same length as Regions.
	Ends []uint64
}

// Op is one contiguous range of a transfer. Src and Dst index the name lists
// of the message that carries the op.
type Op struct {
	Src, Dst       uint32
	SrcOff, DstOff uint64
	Len            uint64
}

// PullRequest asks the peer to send ranges of its regions (SrcRegions) to the
// requester. Dst indices are the requester's own and come back in chunk
// segments unchanged.
type PullRequest struct {
	Transfer   uint64
	Tag        string
	SrcRegions []string
	Ops        []Op
}

// Accept says the transfer was accepted.
type Accept struct {
	Transfer uint64
}

// Ack says chunks of a transfer landed on the receiver's device; each acked
// chunk also returns one credit to the sender.
type Ack struct {
	Transfer uint64
	Chunks   []uint32
}

// Nack fails or refuses a transfer.
type Nack struct {
	Transfer uint64
	Code     Code
	Message  string
}

// Resend says one chunk of a transfer arrived damaged (its CRC32C did not
// match) and was not landed: the sender gathers it again from its source
// and sends it again. Like an Ack, it returns the credit the damaged
// chunk took.
type Resend struct {
	Transfer uint64
	Chunk    uint32
}

// Credit grants more chunk credits.
type Credit struct {
	Grant uint32
}

// Heartbeat keeps an idle session alive; the peer echoes nothing.
type Heartbeat struct {
	Seq       uint64
	UnixNanos int64
}

// Goodbye announces an orderly close.
type Goodbye struct {
	Reason string
}

// Error is a session-level error sent before closing.
type Error struct {
	Code    Code
	Message string
}

// ChunkSeg is where a piece of a chunk's payload lands on the receiver:
// Region indexes the transfer's destination region list.
type ChunkSeg struct {
	Region uint32
	Len    uint32
	Offset uint64
}

// ChunkFixedSize is the fixed part of a chunk body before its segments.
//
//	0  8 transfer
//	8  4 index
//	12 4 count (chunks in the transfer)
//	16 4 number of segments
//	20 4 payload length
//	24 .. segments, 16 bytes each: region u32, len u32, offset u64
//	.. payload
const ChunkFixedSize = 24

// ChunkSegSize is the encoded size of one ChunkSeg.
const ChunkSegSize = 16

// Chunk is a chunk's meta (its payload travels after it, not in this struct).
type Chunk struct {
	Transfer   uint64
	Index      uint32
	Count      uint32
	PayloadLen uint32
	Segs       []ChunkSeg
}

func (*Hello) Type() Type          { return TypeHello }
func (*Challenge) Type() Type      { return TypeChallenge }
func (*Auth) Type() Type           { return TypeAuth }
func (*Welcome) Type() Type        { return TypeWelcome }
func (*DataHello) Type() Type      { return TypeDataHello }
func (*DataAccept) Type() Type     { return TypeDataAccept }
func (*CatalogRequest) Type() Type { return TypeCatalogRequest }
func (*Catalog) Type() Type        { return TypeCatalog }
func (*Announce) Type() Type       { return TypeAnnounce }
func (*PullRequest) Type() Type    { return TypePullRequest }
func (*Accept) Type() Type         { return TypeAccept }
func (*Ack) Type() Type            { return TypeAck }
func (*Nack) Type() Type           { return TypeNack }
func (*Credit) Type() Type         { return TypeCredit }
func (*Resend) Type() Type         { return TypeResend }
func (*Heartbeat) Type() Type      { return TypeHeartbeat }
func (*Goodbye) Type() Type        { return TypeGoodbye }
func (*Error) Type() Type          { return TypeError }
