package wire

// Local control-socket messages. Every request starts with a request id that
// its answer (OK, Fail, Submitted, XferStatus, QueryReply) repeats. Notify is
// sent unasked to connections that subscribed; it has no request id.

// Register registers a region. With FlagFD set, the allocation's fd travels
// as SCM_RIGHTS with the frame.
type Register struct {
	Req       uint64
	Name      string
	Handle    uint8  // device.HandleKind
	Access    Access // rights granted
	Ordinal   uint32 // device ordinal the memory lives on
	AllocSize uint64 // size of the whole shared allocation
	Offset    uint64 // the region's offset inside the allocation
	Length    uint64 // the region's length
	Addr      uint64 // HandleHostAddr only
	HandleRaw []byte // IPC handle or export key
}

// Unregister removes a region; in-flight transfers keep their mapping until done.
//
// WaitMs, when not 0, asks for a confirmed unregister: the answer (OK) comes
// only once no transfer uses the region any more, it is gone from the table
// and, when it was the last region of its allocation, the sidecar's import
// of that allocation is closed; the engine may then free the memory. If a
// transfer still holds the region after WaitMs milliseconds, the answer is
// Fail CodeBusy and the region stays registered. WaitMs is optional on the
// wire: present only when not 0 (PROTOCOL.md 9.4).
type Unregister struct {
	Req    uint64
	Name   string
	WaitMs uint32
}

// Direction of a transfer.
type Direction uint8

const (
	Push Direction = 1 // local regions -> peer's regions
	Pull Direction = 2 // peer's regions -> local regions
)

func (d Direction) String() string {
	switch d {
	case Push:
		return "push"
	case Pull:
		return "pull"
	}
	return "direction(?)"
}

// Checksum choice for a transfer.
const (
	ChecksumRoute uint8 = 0 // as the route says
	ChecksumOn    uint8 = 1
	ChecksumOff   uint8 = 2
)

// LocalOp is one range of a submitted transfer: Local and Remote index
// Submit.LocalNames and Submit.RemoteNames.
type LocalOp struct {
	Local, Remote       uint32
	LocalOff, RemoteOff uint64
	Len                 uint64
}

// Submit starts a transfer on a route.
type Submit struct {
	Req         uint64
	Route       string
	Dir         Direction
	Checksum    uint8
	Tag         string
	LocalNames  []string
	RemoteNames []string
	Ops         []LocalOp
	// Peer names the route's peer that the transfer goes to: its node
	// name (from the handshake) or its host:port. Empty: the route's only
	// peer, or any live one on a route with pick: any. It travels after
	// Ops and only when set, so a Submit without it has the bytes of
	// earlier versions, and a sidecar that predates it refuses one that
	// names a peer (trailing bytes) instead of sending it elsewhere.
	Peer string
}

// SubmitWait is a Submit (same body) answered once the transfer has
// finished, with its XferStatus, instead of at once with Submitted: one
// request and one answer for an engine that waits anyway.
type SubmitWait struct{ Submit }

// Submitted answers Submit.
type Submitted struct {
	Req      uint64
	Transfer uint64
}

// Wait waits for a transfer to finish, at most TimeoutMs (0: no limit).
type Wait struct {
	Req       uint64
	Transfer  uint64
	TimeoutMs uint32
}

// Status asks for a transfer's state now.
type Status struct {
	Req      uint64
	Transfer uint64
}

// Transfer states.
type State uint8

const (
	StateQueued  State = 1
	StateRunning State = 2
	StateDone    State = 3
	StateFailed  State = 4
)

func (s State) String() string {
	switch s {
	case StateQueued:
		return "queued"
	case StateRunning:
		return "running"
	case StateDone:
		return "done"
	case StateFailed:
		return "failed"
	}
	return "state(?)"
}

// XferStatus answers Wait and Status.
type XferStatus struct {
	Req      uint64
	Transfer uint64
	State    State
	Done     uint64 // bytes acked (sender) or landed (receiver)
	Total    uint64
	Code     Code
	Message  string
}

// Cancel cancels a transfer.
type Cancel struct {
	Req      uint64
	Transfer uint64
}

// Subscribe asks to be told of transfers that landed here.
type Subscribe struct {
	Req uint64
}

// Notify tells a subscriber that a transfer from a peer finished on this
// side: for a push, every byte landed on the device (or it failed).
type Notify struct {
	Transfer uint64
	Peer     string
	Route    string // empty when the peer dialed us
	Tag      string
	Dir      Direction // as seen by the peer that initiated it
	Bytes    uint64
	Code     Code
	Message  string
	// A KV transfer (kv.go) also says what landed: the cache (ours), its
	// layers, and the tokens [First, First+Tokens) of the block table the
	// peer named. KV is empty for a byte transfer.
	KV     string
	Layers []uint32
	First  uint32
	Tokens uint32
}

// Query kinds.
const (
	QueryStats   uint8 = 1
	QueryRoutes  uint8 = 2
	QueryRegions uint8 = 3
	QueryCatalog uint8 = 4 // Arg: route name
	QueryDevice  uint8 = 5 // the sidecar's device (DeviceInfo): what an engine needs to share memory with it
)

// Query asks for a JSON document.
type Query struct {
	Req  uint64
	What uint8
	Arg  string
}

// QueryReply carries the JSON document.
type QueryReply struct {
	Req  uint64
	JSON []byte
}

// OK is a plain success answer.
type OK struct {
	Req uint64
}

// Fail is an error answer.
type Fail struct {
	Req     uint64
	Code    Code
	Message string
}

func (*Register) Type() Type   { return TypeRegister }
func (*Unregister) Type() Type { return TypeUnregister }
func (*Submit) Type() Type     { return TypeSubmit }
func (*Submitted) Type() Type  { return TypeSubmitted }
func (*SubmitWait) Type() Type { return TypeSubmitWait }
func (*Wait) Type() Type       { return TypeWait }
func (*Status) Type() Type     { return TypeStatus }
func (*XferStatus) Type() Type { return TypeXferStatus }
func (*Cancel) Type() Type     { return TypeCancel }
func (*Subscribe) Type() Type  { return TypeSubscribe }
func (*Notify) Type() Type     { return TypeNotify }
func (*Query) Type() Type      { return TypeQuery }
func (*QueryReply) Type() Type { return TypeQueryReply }
func (*OK) Type() Type         { return TypeOK }
func (*Fail) Type() Type       { return TypeFail }
