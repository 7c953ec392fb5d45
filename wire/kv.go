package wire

// KV transfers: regions that hold a KV cache carry a layout (docs/KVLAYOUT.md
// has the model), and a transfer names layers, block tables and tokens
// instead of byte ranges. Each side maps the canonical row order to its own
// memory, so the peer frames carry shapes (dtype, widths, heads), never a
// peer's offsets or strides.

// KV frames on the peer control session.
const (
	TypeKVAnnounce    Type = 21 // push of a KV transfer
	TypeKVPull        Type = 22 // pull of a KV transfer
	TypeKVInfoRequest Type = 23 // ask for the shape of the peer's KV cache
	TypeKVInfo        Type = 24 // the shape
)

// KV frames on the local control socket.
const (
	TypeRegisterKV Type = 151 // give regions a KV layout
	TypeSubmitKV   Type = 152 // start a KV transfer
)

func init() {
	for t, n := range map[Type]string{
		TypeKVAnnounce: "KVAnnounce", TypeKVPull: "KVPull", TypeKVInfoRequest: "KVInfoRequest", TypeKVInfo: "KVInfo",
		TypeRegisterKV: "RegisterKV", TypeSubmitKV: "SubmitKV",
	} {
		typeNames[t] = n
		knownTypes[t] = true
	}
}

// Limits of the KV frames.
const (
	MaxKVParts  = 8       // parts of one layout (K, V; latent, rope)
	MaxKVLayers = 4096    // layers of one KV cache or transfer
	MaxKVBlocks = 1 << 20 // block ids in one block table
)

// KVPart is one part of a layout: where the row of (block, slot, head)
// lives in tensor Tensor of the layer. Offsets and strides are bytes.
type KVPart struct {
	Name        string
	Width       uint32 // elements in the part's row
	Tensor      uint8  // which of the layer's regions holds it
	Offset      uint64 // row (block 0, slot 0, first held head)
	BlockStride uint64
	SlotStride  uint64
	HeadStride  uint64
}

// KVLayout is one layer of a KV cache as its engine stores it.
type KVLayout struct {
	DType     uint8  // kvlayout.DType
	BlockSize uint32 // tokens per block
	Blocks    uint32 // block ids are 0..Blocks-1
	Heads     uint32 // kv heads of the model
	HeadLo    uint32 // this rank holds heads [HeadLo, HeadHi)
	HeadHi    uint32
	Parts     []KVPart
}

// KVShape is what a peer needs of the other side's layout to check a
// transfer and cut the logical row into the same columns: no offsets or
// strides.
type KVShape struct {
	DType     uint8
	BlockSize uint32
	Blocks    uint32
	Heads     uint32
	HeadLo    uint32
	HeadHi    uint32
	Widths    []uint32 // part widths in elements, in order
	Flags     uint8    // KVHeadOuter
}

// KVShape flags.
const (
	// KVHeadOuter: every part keeps a head's tokens of a block together
	// (HND, packed K|V), so two such sides may move in block-major order.
	KVHeadOuter uint8 = 1 << 0
)

// Canonical orders of a KV transfer (kvlayout.Order).
const (
	KVTokenMajor uint8 = 0
	KVBlockMajor uint8 = 1
)

// RegisterKV gives a KV layout to regions already registered: layer l's
// tensor t is region Layers[l][t]. The name is the KV cache's, used by
// SubmitKV and by peers.
type RegisterKV struct {
	Req    uint64
	Name   string
	Layout KVLayout
	Layers [][]string
}

// SubmitKV starts a KV transfer: the rows of Tokens tokens starting at token
// LocalFirst of the local block table (RemoteFirst of the remote one), of
// the listed layers, heads [HeadLo, HeadHi) (both 0: every head both sides
// hold).
type SubmitKV struct {
	Req          uint64
	Route        string
	Peer         string // the peer's node name or address; empty: the route's only peer
	Dir          Direction
	Checksum     uint8
	Tag          string
	Local        string   // local KV cache name
	Remote       string   // the peer's KV cache name
	Layers       []uint32 // local layer indices
	RemoteLayers []uint32 // the peer's, one per local layer; empty: the same indices
	LocalBlocks  []uint32
	RemoteBlocks []uint32
	LocalFirst   uint32
	RemoteFirst  uint32
	Tokens       uint32
	HeadLo       uint32
	HeadHi       uint32
	Key          []byte // the grant the peer checks (Grant); nil: none, and no bytes on the wire
}

// KVRequest is the peer's half of a KV transfer, the same for a push
// (KVAnnounce: Name is the receiver's cache, Blocks its table) and a pull
// (KVPull: Name is the serving side's cache). Shape is the sender's own
// layout; PeerShape what the sender believes of the peer's (from KVInfo),
// so a peer whose layout changed since refuses instead of misplacing rows.
type KVRequest struct {
	Transfer  uint64
	Tag       string
	Total     uint64 // canonical bytes
	Name      string
	Layers    []uint32
	Blocks    []uint32
	First     uint32
	Tokens    uint32
	HeadLo    uint32
	HeadHi    uint32
	Order     uint8 // KVTokenMajor or KVBlockMajor
	Shape     KVShape
	PeerShape KVShape
	Key       []byte // the grant it uses (Grant): optional, last; nil: no bytes on the wire
}

// KVAnnounce starts a KV push (see KVRequest).
type KVAnnounce struct{ KVRequest }

// KVPull asks the peer to send a KV transfer (see KVRequest); chunks come
// back in canonical order, each addressed by its canonical offset.
type KVPull struct{ KVRequest }

// KVInfoRequest asks for the shape of the peer's KV cache Name.
type KVInfoRequest struct {
	Seq  uint64
	Name string
}

// KVInfo answers KVInfoRequest: Found is false when no KV cache has that
// name (or its regions grant the asker nothing).
type KVInfo struct {
	Seq    uint64
	Name   string
	Found  bool
	Layers uint32
	Shape  KVShape
}

// KVRegion is the Region of a KV chunk's one segment: its Offset is the
// chunk's offset in the transfer's canonical byte stream, which the
// receiver maps to its own layout.
const KVRegion = ^uint32(0)

// Type implements Msg.
func (*RegisterKV) Type() Type    { return TypeRegisterKV }
func (*SubmitKV) Type() Type      { return TypeSubmitKV }
func (*KVAnnounce) Type() Type    { return TypeKVAnnounce }
func (*KVPull) Type() Type        { return TypeKVPull }
func (*KVInfoRequest) Type() Type { return TypeKVInfoRequest }
func (*KVInfo) Type() Type        { return TypeKVInfo }
