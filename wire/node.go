package wire

// Same-node frames. Two of them travel on the peer control session
// (NodeInfo, Revoke); the rest on the node socket, a Unix stream socket in a
// directory both sidecars of one node share (see docs/PROTOCOL.md section 11).
// Node-socket frames use the local type range, so RegionHandle and ShmRing
// may carry an fd (FlagFD, SCM_RIGHTS).

// Peer control frames of the same-node paths.
const (
	TypeNodeInfo Type = 18 // either: same-node offer (node socket name, device)
	TypeRevoke   Type = 19 // exporter -> importer: a region handed out was unregistered
)

// Node-socket frames.
const (
	TypeNodeHello     Type = 144 // importer -> exporter: join a peer session
	TypeHandleRequest Type = 145 // importer -> exporter: handles of a transfer's regions
	TypeRegionHandle  Type = 146 // exporter -> importer: one region's handle (fd with FlagFD)
	TypeDirectDone    Type = 147 // importer -> exporter: the bytes were copied directly
	TypeShmRing       Type = 148 // sender -> receiver: the shared ring (memfd with FlagFD)
	TypeShmChunk      Type = 149 // sender -> receiver: ring slot holds a chunk
	TypeShmLanded     Type = 150 // receiver -> sender: the slot's chunk landed (or failed)
	TypeLinkWake      Type = 162 // importer -> exporter: the handle of the exporter's wake buffer
)

func init() {
	for t, n := range map[Type]string{
		TypeNodeInfo: "NodeInfo", TypeRevoke: "Revoke", TypeNodeHello: "NodeHello",
		TypeHandleRequest: "HandleRequest", TypeRegionHandle: "RegionHandle", TypeDirectDone: "DirectDone",
		TypeShmRing: "ShmRing", TypeShmChunk: "ShmChunk", TypeShmLanded: "ShmLanded", TypeLinkWake: "LinkWake",
	} {
		typeNames[t] = n
		knownTypes[t] = true
	}
}

// NodeInfo is sent by each side of a session whose peers share a node.
// Socket is the file name of the sender's node socket inside the shared
// socket directory ("" when it serves none); Device names its device
// ("cuda:1", "hostmem:0").
type NodeInfo struct {
	Socket string
	Device string
}

// Revoke tells a peer that region RegionID, whose handle it was given, is
// unregistered: it must close its mapping once no copy uses it.
type Revoke struct {
	RegionID uint64
}

// LinkWake asks the exporter for the handle of its wake buffer: a little
// device memory of the exporter's own, not any engine's, that the importer
// may write to before a direct push so that the link between the two
// devices is awake when the push's copy starts. The answer is one
// RegionHandle with Transfer 0 and RegionID 0, or a Fail. Its body is
// empty.
type LinkWake struct{}

// NodeHello opens a node-socket connection for an established peer session.
type NodeHello struct {
	SessionID [SessionIDSize]byte
	Proof     [ProofSize]byte // HMAC(token, "stage-node" | session id | client nonce | server nonce)
}

// HandleRequest asks for the handles of a transfer's regions on the
// exporter: for a push, the destination regions its Announce named (in that
// order); for a pull, the source regions to read.
type HandleRequest struct {
	Transfer uint64
	Dir      Direction
	Tag      string // pull: passed to the exporter's subscribers
	Regions  []string
}

// RegionHandle is one region's handle, the answer to HandleRequest (one
// frame per region, in request order). Handle kinds with an fd travel with
// FlagFD and the fd as SCM_RIGHTS.
type RegionHandle struct {
	Transfer  uint64
	Index     uint32 // position in HandleRequest.Regions
	RegionID  uint64 // unique per registration on the exporter (Revoke names it)
	Kind      uint8  // device.HandleKind
	Access    Access // the region's rights
	AllocKey  string // identity of the allocation on the exporter (same key: same allocation)
	AllocSize uint64 // bytes of the whole allocation
	Offset    uint64 // the region's offset inside the allocation
	Length    uint64 // the region's length
	Device    string // exporter's device, e.g. "cuda:1"
	Raw       []byte // IPC handle bytes (cuda-ipc, hip-ipc); empty for fd kinds
}

// DirectDone says the importer copied Bytes bytes of Transfer directly
// (into the exporter's regions for a push, out of them for a pull).
type DirectDone struct {
	Transfer uint64
	Bytes    uint64
}

// ShmRing hands the receiver the ring shared on this node connection:
// Slots slots of SlotSize bytes in a memfd (FlagFD).
type ShmRing struct {
	Slots    uint32
	SlotSize uint32
}

// ShmChunk says ring slot Slot holds chunk Index of Count of Transfer,
// PayloadLen bytes landing where Segs say (as a Chunk frame's segments).
type ShmChunk struct {
	Transfer   uint64
	Slot       uint32
	Index      uint32
	Count      uint32
	PayloadLen uint32
	Segs       []ChunkSeg
}

// ShmLanded answers ShmChunk once the slot's bytes are on the receiver's
// device (Code OK) or could not land; the slot is free again either way.
type ShmLanded struct {
	Transfer uint64
	Slot     uint32
	Index    uint32
	Code     Code
	Message  string
}

func (*NodeInfo) Type() Type      { return TypeNodeInfo }
func (*Revoke) Type() Type        { return TypeRevoke }
func (*NodeHello) Type() Type     { return TypeNodeHello }
func (*HandleRequest) Type() Type { return TypeHandleRequest }
func (*RegionHandle) Type() Type  { return TypeRegionHandle }
func (*DirectDone) Type() Type    { return TypeDirectDone }
func (*ShmRing) Type() Type       { return TypeShmRing }
func (*ShmChunk) Type() Type      { return TypeShmChunk }
func (*ShmLanded) Type() Type     { return TypeShmLanded }
func (*LinkWake) Type() Type      { return TypeLinkWake }
