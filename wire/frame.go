package wire

import (
	"errors"
	"fmt"
)

// Frame header layout (16 bytes, little-endian):
//
//	0  2  magic   'S' 'G'
//	2  1  version
//	3  1  type
//	4  2  flags
//	6  2  reserved, zero
//	8  4  length of the body that follows
//	12 4  CRC32C (Castagnoli) of the body when FlagCRC is set, else zero
const HeaderSize = 16

// Protocol versions this build speaks.
const (
	VersionMin uint8 = 1
	VersionMax uint8 = 1
)

// Magic bytes at the start of every frame.
const (
	Magic0 = 'S'
	Magic1 = 'G'
)

// Limits. Decoders check lengths against these before allocating or reading.
const (
	MaxControlBody = 16 << 20  // any frame but a chunk
	MaxChunkBody   = 257 << 20 // chunk meta + payload (slots are at most 256 MiB)
	MaxChunkSegs   = 1 << 16   // segments in one chunk
	MaxName        = 255       // region, route, node names
	MaxTag         = 1024      // transfer tag
	MaxMessage     = 4096      // error message text
	MaxOps         = 1 << 20   // ops in one transfer
	MaxNames       = 4096      // region names in one transfer
	MaxHandleBytes = 65528     // IPC handle, export key, or an acl-vmm chunk list (24 + 16 × 4094 chunks)
	MaxJSON        = 8 << 20   // query answers
	MaxAckChunks   = 1 << 16   // chunk indices in one Ack
	MaxRegions     = 1 << 16   // regions in one Catalog
)

// Flags in the header.
type Flags uint16

const (
	// FlagCRC: the header's CRC field holds the CRC32C of the body.
	FlagCRC Flags = 1 << 0
	// FlagFD: (control socket only) one file descriptor travels with this
	// frame as SCM_RIGHTS ancillary data.
	FlagFD Flags = 1 << 1
	// FlagInline: (data streams only, on Announce and Chunk) a small push
	// travels whole on one data stream: an Announce, then its only chunk,
	// which the receiver lands at once and acks on the control session.
	FlagInline Flags = 1 << 2
)

// Header is a decoded frame header.
type Header struct {
	Version uint8
	Type    Type
	Flags   Flags
	Length  uint32
	CRC     uint32
}

// Errors. Decoders wrap these with what was wrong and the values involved.
var (
	ErrMalformed   = errors.New("wire: malformed frame")
	ErrTooLarge    = errors.New("wire: frame too large")
	ErrBadMagic    = errors.New("wire: bad magic")
	ErrBadVersion  = errors.New("wire: unsupported version")
	ErrUnknownType = errors.New("wire: unknown frame type")
	ErrChecksum    = errors.New("wire: checksum mismatch")
	// ErrOverflow: an offset plus a length does not fit in 64 bits. It
	// wraps ErrMalformed, so callers that only ask for that still match.
	ErrOverflow = fmt.Errorf("%w: range overflows 64 bits", ErrMalformed)
)

// Type is a frame type. Peer frames are 1..63, chunk frames 64, local
// control-socket frames 128..255.
type Type uint8

// Peer protocol frames.
const (
	TypeHello          Type = 1  // client -> server: open a control session
	TypeChallenge      Type = 2  // server -> client: server's nonce and proof
	TypeAuth           Type = 3  // client -> server: client's proof
	TypeWelcome        Type = 4  // server -> client: session established
	TypeDataHello      Type = 5  // client -> server: open a data stream of a session
	TypeDataAccept     Type = 6  // server -> client: data stream accepted
	TypeCatalogRequest Type = 7  // ask for the peer's region catalog
	TypeCatalog        Type = 8  // the catalog
	TypeAnnounce       Type = 9  // push: sender announces a transfer
	TypePullRequest    Type = 10 // pull: requester asks the peer to send
	TypeAccept         Type = 11 // transfer accepted
	TypeAck            Type = 12 // chunks landed on the receiver's device; returns credits
	TypeNack           Type = 13 // transfer failed or refused
	TypeCredit         Type = 14 // more credits
	TypeHeartbeat      Type = 15
	TypeGoodbye        Type = 16
	TypeError          Type = 17 // session-level error, then close
	TypeResend         Type = 20 // chunk receiver -> sender: a chunk arrived damaged; send it again
	TypeChunk          Type = 64 // data stream: chunk meta + payload
)

// Local control-socket frames.
const (
	TypeRegister   Type = 128
	TypeUnregister Type = 129
	TypeSubmit     Type = 130
	TypeSubmitted  Type = 131
	TypeWait       Type = 132
	TypeStatus     Type = 133
	TypeXferStatus Type = 134
	TypeCancel     Type = 135
	TypeSubscribe  Type = 136
	TypeNotify     Type = 137
	TypeQuery      Type = 138
	TypeQueryReply Type = 139
	TypeOK         Type = 140
	TypeFail       Type = 141
	TypeSubmitWait Type = 142
)

func (t Type) String() string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

var typeNames = map[Type]string{
	TypeHello: "Hello", TypeChallenge: "Challenge", TypeAuth: "Auth", TypeWelcome: "Welcome",
	TypeDataHello: "DataHello", TypeDataAccept: "DataAccept", TypeCatalogRequest: "CatalogRequest",
	TypeCatalog: "Catalog", TypeAnnounce: "Announce", TypePullRequest: "PullRequest", TypeAccept: "Accept",
	TypeAck: "Ack", TypeNack: "Nack", TypeCredit: "Credit", TypeHeartbeat: "Heartbeat", TypeGoodbye: "Goodbye",
	TypeError: "Error", TypeResend: "Resend", TypeChunk: "Chunk",
	TypeRegister: "Register", TypeUnregister: "Unregister", TypeSubmit: "Submit", TypeSubmitted: "Submitted",
	TypeWait: "Wait", TypeStatus: "Status", TypeXferStatus: "XferStatus", TypeCancel: "Cancel",
	TypeSubscribe: "Subscribe", TypeNotify: "Notify", TypeQuery: "Query", TypeQueryReply: "QueryReply",
	TypeOK: "OK", TypeFail: "Fail", TypeSubmitWait: "SubmitWait",
}

// Msg is any frame body but a chunk's.
type Msg interface {
	Type() Type
	// AppendBody appends the encoded body (no header) to dst.
	AppendBody(dst []byte) []byte
}

// Code classifies failures on both protocols.
type Code uint16

const (
	CodeOK              Code = 0
	CodeBadRequest      Code = 1
	CodeUnknownRoute    Code = 2
	CodeUnknownRegion   Code = 3
	CodeOutOfRange      Code = 4
	CodeAccessDenied    Code = 5
	CodeAuthFailed      Code = 6
	CodePeerUnavailable Code = 7
	CodeTimeout         Code = 8
	CodeCancelled       Code = 9
	CodeChecksum        Code = 10
	CodeInternal        Code = 11
	CodeBusy            Code = 12
	CodeExists          Code = 13
	CodeUnsupported     Code = 14
	CodeMalformed       Code = 15
	CodeUnknownTransfer Code = 16
	CodeDevice          Code = 17
	CodeShutdown        Code = 18
	CodeUnknownPeer     Code = 19
)

var codeNames = map[Code]string{
	CodeOK: "ok", CodeBadRequest: "bad request", CodeUnknownRoute: "unknown route",
	CodeUnknownRegion: "unknown region", CodeOutOfRange: "out of range", CodeAccessDenied: "access denied",
	CodeAuthFailed: "authentication failed", CodePeerUnavailable: "peer unavailable", CodeTimeout: "timeout",
	CodeCancelled: "cancelled", CodeChecksum: "checksum mismatch", CodeInternal: "internal error",
	CodeBusy: "busy", CodeExists: "already exists", CodeUnsupported: "unsupported", CodeMalformed: "malformed",
	CodeUnknownTransfer: "unknown transfer", CodeDevice: "device error", CodeShutdown: "shutting down",
	CodeUnknownPeer: "unknown peer",
}

func (c Code) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("code(%d)", uint16(c))
}

// Access rights of a region, as a bit set.
type Access uint8

const (
	AccessLocalRead   Access = 1 << 0 // the local engine may push from it
	AccessLocalWrite  Access = 1 << 1 // the local engine may pull into it
	AccessRemoteWrite Access = 1 << 2 // peers may push into it
	AccessRemoteRead  Access = 1 << 3 // peers may pull from it
	AccessAll                = AccessLocalRead | AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
)
