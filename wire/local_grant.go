package wire

// Grants (PROTOCOL.md 9.20): an engine tells its sidecar which peer
// request may read (or write) which blocks of its KV cache. A peer's
// KVPull or KVAnnounce names the grant by its key; a guarded cache
// refuses a request that names no live grant covering exactly its blocks.

// Grant frames on the local control socket.
const (
	TypeGrant       Type = 158 // allow one transfer key on blocks of a KV cache
	TypeRevokeGrant Type = 159 // end a grant before its time
)

// Limits of a grant.
const (
	MinGrantKey   = 16          // bytes; shorter keys are refused by the decoder (guessable)
	MaxGrantKey   = 64          // bytes
	MaxGrantTTLMs = 3_600_000   // a grant lives at most an hour
	MaxGrantUses  = 1024        // complete pulls one grant allows
	MaxGrants     = 1 << 16     // live grants of one KV cache
	maxGrantBlock = MaxKVBlocks // block ids in one grant
)

func init() {
	typeNames[TypeGrant], typeNames[TypeRevokeGrant] = "Grant", "RevokeGrant"
	knownTypes[TypeGrant], knownTypes[TypeRevokeGrant] = true, true
}

// Grant lets the holder of Key read (Write false: a peer's KVPull) or write
// (Write true: a peer's KVAnnounce) exactly the block table Blocks of the
// KV cache Cache, for TTLMs milliseconds. A read grant ends after Uses
// admitted pulls (0 is refused); a write grant ignores Uses (0) and lasts
// until revoked or expired, since a push comes as one transfer per layer.
// A Grant with no blocks grants nothing: it only guards the cache. The
// engine makes Key unguessable (random, MinGrantKey bytes or more).
// Answered OK or Fail.
type Grant struct {
	Req    uint64
	Cache  string
	Key    []byte
	Write  bool
	TTLMs  uint32
	Uses   uint16
	Blocks []uint32
}

// RevokeGrant ends the grant Key of KV cache Cache (nothing when there is none:
// it may have ended already). Answered OK or Fail.
type RevokeGrant struct {
	Req   uint64
	Cache string
	Key   []byte
}

func (*Grant) Type() Type       { return TypeGrant }
func (*RevokeGrant) Type() Type { return TypeRevokeGrant }

// AppendBody appends the encoded Grant body to dst.
func (m *Grant) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	dst = appendStr(dst, m.Cache)
	dst = appendBytes16(dst, m.Key)
	dst = appendBool(dst, m.Write)
	dst = appendU32(dst, m.TTLMs)
	dst = appendU16(dst, m.Uses)
	return appendU32s(dst, m.Blocks)
}

func (m *Grant) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Cache = d.str("Cache", MaxName)
	m.Key = d.grantKey("Key")
	m.Write = d.boolean("Write")
	m.TTLMs = d.u32("TTLMs")
	if d.err == nil && (m.TTLMs == 0 || m.TTLMs > MaxGrantTTLMs) {
		d.fail(ErrMalformed, "TTLMs", "%d ms; want 1 to %d", m.TTLMs, MaxGrantTTLMs)
	}
	m.Uses = d.u16("Uses")
	if d.err == nil && (m.Uses > MaxGrantUses || (m.Uses == 0) != m.Write) {
		d.fail(ErrMalformed, "Uses", "%d uses for a %s grant; want 1 to %d for a read, 0 for a write", m.Uses, rw(m.Write), MaxGrantUses)
	}
	m.Blocks = d.u32s("Blocks", maxGrantBlock)
}

func rw(write bool) string {
	if write {
		return "write"
	}
	return "read"
}

// AppendBody appends the encoded RevokeGrant body to dst.
func (m *RevokeGrant) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	dst = appendStr(dst, m.Cache)
	return appendBytes16(dst, m.Key)
}

func (m *RevokeGrant) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Cache = d.str("Cache", MaxName)
	m.Key = d.grantKey("Key")
}

// grantKey reads a transfer key: MinGrantKey to MaxGrantKey bytes.
func (d *decoder) grantKey(field string) []byte {
	k := d.bytes16(field, MaxGrantKey)
	if d.err == nil && len(k) < MinGrantKey {
		d.fail(ErrMalformed, field, "%d-byte key; want %d to %d random bytes", len(k), MinGrantKey, MaxGrantKey)
	}
	return k
}

// optKey reads the optional transfer key that ends a KVRequest or a
// SubmitKV: absent (nil) when the body ends, else a grant key.
func (d *decoder) optKey(field string) []byte {
	if d.err != nil || d.rem() == 0 {
		return nil
	}
	return d.grantKey(field)
}

// appendOptKey appends key when there is one (an old peer's decoder would
// refuse the bytes; a keyless request stays as it was).
func appendOptKey(dst, key []byte) []byte {
	if len(key) == 0 {
		return dst
	}
	return appendBytes16(dst, key)
}

// decodeGrant is decodeMsg for Grant and RevokeGrant, then Join.
func decodeGrant(t Type, d *decoder) Msg {
	switch t {
	case TypeGrant:
		m := new(Grant)
		m.decode(d)
		return m
	case TypeRevokeGrant:
		m := new(RevokeGrant)
		m.decode(d)
		return m
	}
	return decodeJoin(t, d)
}
