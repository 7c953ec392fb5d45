package wire

// Join (PROTOCOL.md 9.18): a control-socket connection joins an ownership
// group. Regions, KV caches and transfers belong to the connection that
// made them; connections that joined one group (the same token) may use,
// check and cancel each other's, and all of them hear the group's
// notifications. A connection that never joins is a group of its own.

// TypeJoin is the Join frame on the local control socket.
const TypeJoin Type = 153

// Limits of a group token.
const (
	MinGroup = 16 // bytes; shorter tokens are refused by the sidecar (guessable)
	MaxGroup = 64 // bytes; longer ones are refused by the decoder
)

func init() {
	typeNames[TypeJoin] = "Join"
	knownTypes[TypeJoin] = true
}

// Join puts the connection into the group named by Group, a secret the
// group's processes share (at least MinGroup bytes). It must be the
// connection's first request; answered OK or Fail.
type Join struct {
	Req   uint64
	Group []byte
}

func (*Join) Type() Type { return TypeJoin }

// AppendBody appends the encoded Join body to dst.
func (m *Join) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	return appendBytes16(dst, m.Group)
}

func (m *Join) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Group = d.bytes16("Group", MaxGroup)
}

// decodeJoin is decodeMsg for Join; nil for any other type.
func decodeJoin(t Type, d *decoder) Msg {
	if t != TypeJoin {
		return nil
	}
	m := new(Join)
	m.decode(d)
	return m
}
