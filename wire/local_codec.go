package wire

import "math"

// Local control-socket message codecs: fields in declaration order.

// AppendBody appends the encoded Register body to dst.
func (m *Register) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	dst = appendStr(dst, m.Name)
	dst = appendU8(dst, m.Handle)
	dst = appendU8(dst, uint8(m.Access))
	dst = appendU32(dst, m.Ordinal)
	dst = appendU64(dst, m.AllocSize)
	dst = appendU64(dst, m.Offset)
	dst = appendU64(dst, m.Length)
	dst = appendU64(dst, m.Addr)
	return appendBytes16(dst, m.HandleRaw)
}

func (m *Register) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Name = d.str("Name", MaxName)
	m.Handle = d.u8("Handle")
	m.Access = d.access("Access")
	m.Ordinal = d.u32("Ordinal")
	m.AllocSize = d.u64("AllocSize")
	m.Offset = d.u64("Offset")
	m.Length = d.u64("Length")
	m.Addr = d.u64("Addr")
	m.HandleRaw = d.bytes16("HandleRaw", MaxHandleBytes)
}

// AppendBody appends the encoded Unregister body to dst.
func (m *Unregister) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	dst = appendStr(dst, m.Name)
	if m.WaitMs != 0 {
		dst = appendU32(dst, m.WaitMs)
	}
	return dst
}

func (m *Unregister) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Name = d.str("Name", MaxName)
	if d.err == nil && d.rem() > 0 {
		// The optional tail: present only for a confirmed unregister, so a
		// zero one is not canonical.
		m.WaitMs = d.u32("WaitMs")
		if d.err == nil && m.WaitMs == 0 {
			d.fail(ErrMalformed, "WaitMs", "present but 0 (leave it out for an unconfirmed unregister)")
		}
	}
}

// AppendBody appends the encoded Submit body to dst. It grows dst once to
// the body's full size, so a push of many ops costs one allocation (or
// none, when dst has room), and writes the ops with fixed offsets.
func (m *Submit) AppendBody(dst []byte) []byte {
	n := listLen(len(m.Ops))
	need := m.headSize() + 4 + n*localOpSize
	if m.Peer != "" {
		need += strSize(m.Peer)
	}
	dst = grow(dst, need)
	dst = appendU64(dst, m.Req)
	return m.appendRest(dst)
}

// appendRest appends what follows Req in a Submit body.
func (m *Submit) appendRest(dst []byte) []byte {
	dst = appendStr(dst, m.Route)
	dst = appendU8(dst, uint8(m.Dir))
	dst = appendU8(dst, m.Checksum)
	dst = appendStr(dst, m.Tag)
	dst = appendStrs(dst, m.LocalNames)
	dst = appendStrs(dst, m.RemoteNames)
	dst = appendLocalOps(dst, m.Ops)
	if m.Peer != "" {
		dst = appendStr(dst, m.Peer)
	}
	return dst
}

// grow returns dst with room for need more bytes, growing it once.
func grow(dst []byte, need int) []byte {
	if cap(dst)-len(dst) < need {
		dst = append(make([]byte, 0, len(dst)+need), dst...)
	}
	return dst
}

// appendLocalOps appends a LocalOp list (count, then the ops at fixed
// offsets); dst should have room for it (grow).
func appendLocalOps(dst []byte, ops []LocalOp) []byte {
	n := listLen(len(ops))
	dst = appendU32(dst, uint32(n))
	start := len(dst)
	dst = grow(dst, n*localOpSize)[:start+n*localOpSize]
	b := dst[start:]
	for i := range ops[:n] {
		op := &ops[i]
		p := b[i*localOpSize : (i+1)*localOpSize : (i+1)*localOpSize]
		le.PutUint32(p[0:], op.Local)
		le.PutUint32(p[4:], op.Remote)
		le.PutUint64(p[8:], op.LocalOff)
		le.PutUint64(p[16:], op.RemoteOff)
		le.PutUint64(p[24:], op.Len)
	}
	return dst
}

// headSize is the encoded size of everything before the op count, as
// AppendBody writes it (long strings cut to their prefix's limit).
func (m *Submit) headSize() int {
	return 8 + strSize(m.Route) + 1 + 1 + strSize(m.Tag) + strsSize(m.LocalNames) + strsSize(m.RemoteNames)
}

// strSize is the size appendStr writes for s.
func strSize(s string) int { return 2 + min(len(s), math.MaxUint16) }

// strsSize is the size appendStrs writes for ss.
func strsSize(ss []string) int {
	n := 4
	for _, s := range ss[:listLen(len(ss))] {
		n += strSize(s)
	}
	return n
}

func (m *Submit) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.decodeRest(d)
}

// decodeRest reads what follows Req in a Submit body.
func (m *Submit) decodeRest(d *decoder) {
	m.Route = d.str("Route", MaxName)
	m.Dir = d.direction("Dir")
	m.Checksum = d.u8("Checksum")
	if d.err == nil && m.Checksum > ChecksumOff {
		d.fail(ErrMalformed, "Checksum", "unknown checksum choice %d", m.Checksum)
	}
	m.Tag = d.str("Tag", MaxTag)
	m.LocalNames = d.strs("LocalNames", MaxNames, MaxName)
	m.RemoteNames = d.strs("RemoteNames", MaxNames, MaxName)
	m.Ops = decodeLocalOps(d, uint64(len(m.LocalNames)), uint64(len(m.RemoteNames)))
	if d.err == nil && d.rem() > 0 {
		// The optional tail: present only when a peer is named, so an
		// empty one is not canonical.
		m.Peer = d.str("Peer", MaxName)
		if d.err == nil && m.Peer == "" {
			d.fail(ErrMalformed, "Peer", "present but empty (leave it out to name no peer)")
		}
	}
}

// decodeLocalOps reads a LocalOp list (Submit.Ops, SubmitMore.Ops) whose
// Local and Remote index lists of nl and nr names; nil when empty or bad.
func decodeLocalOps(d *decoder, nl, nr uint64) []LocalOp {
	n := d.count("Ops", MaxOps, localOpSize)
	if d.err != nil || n == 0 {
		return nil
	}
	// count checked that n ops fit in what remains: take them at once and
	// decode with fixed offsets, one pass.
	b := d.take("Ops", n*localOpSize)
	if b == nil {
		return nil
	}
	ops := make([]LocalOp, n)
	for i := range ops {
		p := b[i*localOpSize : (i+1)*localOpSize : (i+1)*localOpSize]
		op := &ops[i]
		op.Local = le.Uint32(p[0:])
		op.Remote = le.Uint32(p[4:])
		op.LocalOff = le.Uint64(p[8:])
		op.RemoteOff = le.Uint64(p[16:])
		op.Len = le.Uint64(p[24:])
		if uint64(op.Local) >= nl || uint64(op.Remote) >= nr || op.Len == 0 ||
			op.LocalOff > math.MaxUint64-op.Len || op.RemoteOff > math.MaxUint64-op.Len {
			d.idx = i
			d.badLocalOp(op, nl, nr)
			return nil
		}
	}
	return ops
}

// badLocalOp records why op (Submit.Ops[d.idx]) is invalid.
func (d *decoder) badLocalOp(op *LocalOp, nl, nr uint64) {
	switch {
	case uint64(op.Local) >= nl:
		d.fail(ErrMalformed, "Ops[].Local", "index %d out of range (%d local names)", op.Local, nl)
	case uint64(op.Remote) >= nr:
		d.fail(ErrMalformed, "Ops[].Remote", "index %d out of range (%d remote names)", op.Remote, nr)
	case op.Len == 0:
		d.fail(ErrMalformed, "Ops[].Len", "zero length")
	case op.LocalOff > math.MaxUint64-op.Len:
		d.fail(ErrOverflow, "Ops[].LocalOff", "offset %d + length %d overflows", op.LocalOff, op.Len)
	default:
		d.fail(ErrOverflow, "Ops[].RemoteOff", "offset %d + length %d overflows", op.RemoteOff, op.Len)
	}
}

// direction reads a Direction and rejects anything but Push and Pull.
func (d *decoder) direction(field string) Direction {
	v := Direction(d.u8(field))
	if d.err == nil && v != Push && v != Pull {
		d.fail(ErrMalformed, field, "unknown direction %d", uint8(v))
	}
	return v
}

// AppendBody appends the encoded Submitted body to dst.
func (m *Submitted) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	return appendU64(dst, m.Transfer)
}

func (m *Submitted) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Transfer = d.u64("Transfer")
}

// AppendBody appends the encoded Wait body to dst.
func (m *Wait) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	dst = appendU64(dst, m.Transfer)
	return appendU32(dst, m.TimeoutMs)
}

func (m *Wait) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Transfer = d.u64("Transfer")
	m.TimeoutMs = d.u32("TimeoutMs")
}

// AppendBody appends the encoded Status body to dst.
func (m *Status) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	return appendU64(dst, m.Transfer)
}

func (m *Status) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Transfer = d.u64("Transfer")
}

// AppendBody appends the encoded XferStatus body to dst.
func (m *XferStatus) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	dst = appendU64(dst, m.Transfer)
	dst = appendU8(dst, uint8(m.State))
	dst = appendU64(dst, m.Done)
	dst = appendU64(dst, m.Total)
	dst = appendU16(dst, uint16(m.Code))
	return appendText(dst, m.Message)
}

func (m *XferStatus) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Transfer = d.u64("Transfer")
	m.State = State(d.u8("State"))
	if d.err == nil && (m.State < StateQueued || m.State > StateFailed) {
		d.fail(ErrMalformed, "State", "unknown state %d", uint8(m.State))
	}
	m.Done = d.u64("Done")
	m.Total = d.u64("Total")
	m.Code = Code(d.u16("Code"))
	m.Message = d.str("Message", MaxMessage)
}

// AppendBody appends the encoded Cancel body to dst.
func (m *Cancel) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	return appendU64(dst, m.Transfer)
}

func (m *Cancel) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Transfer = d.u64("Transfer")
}

// AppendBody appends the encoded Subscribe body to dst.
func (m *Subscribe) AppendBody(dst []byte) []byte { return appendU64(dst, m.Req) }

func (m *Subscribe) decode(d *decoder) { m.Req = d.u64("Req") }

// AppendBody appends the encoded Notify body to dst.
func (m *Notify) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Transfer)
	dst = appendStr(dst, m.Peer)
	dst = appendStr(dst, m.Route)
	dst = appendStr(dst, m.Tag)
	dst = appendU8(dst, uint8(m.Dir))
	dst = appendU64(dst, m.Bytes)
	dst = appendU16(dst, uint16(m.Code))
	dst = appendText(dst, m.Message)
	dst = appendStr(dst, m.KV)
	dst = appendU32s(dst, m.Layers)
	dst = appendU32(dst, m.First)
	return appendU32(dst, m.Tokens)
}

func (m *Notify) decode(d *decoder) {
	m.Transfer = d.u64("Transfer")
	m.Peer = d.str("Peer", MaxName)
	m.Route = d.str("Route", MaxName)
	m.Tag = d.str("Tag", MaxTag)
	m.Dir = d.direction("Dir")
	m.Bytes = d.u64("Bytes")
	m.Code = Code(d.u16("Code"))
	m.Message = d.str("Message", MaxMessage)
	m.KV = d.str("KV", MaxName)
	m.Layers = d.u32s("Layers", MaxKVLayers)
	m.First = d.u32("First")
	m.Tokens = d.u32("Tokens")
}

// AppendBody appends the encoded Query body to dst.
func (m *Query) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	dst = appendU8(dst, m.What)
	return appendStr(dst, m.Arg)
}

func (m *Query) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.What = d.u8("What")
	m.Arg = d.str("Arg", MaxName)
}

// AppendBody appends the encoded QueryReply body to dst.
func (m *QueryReply) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	return appendBytes32(dst, m.JSON)
}

func (m *QueryReply) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.JSON = d.bytes32("JSON", MaxJSON)
}

// AppendBody appends the encoded OK body to dst.
func (m *OK) AppendBody(dst []byte) []byte { return appendU64(dst, m.Req) }

func (m *OK) decode(d *decoder) { m.Req = d.u64("Req") }

// AppendBody appends the encoded Fail body to dst.
func (m *Fail) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	dst = appendU16(dst, uint16(m.Code))
	return appendText(dst, m.Message)
}

func (m *Fail) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Code = Code(d.u16("Code"))
	m.Message = d.str("Message", MaxMessage)
}

// decodeLocalMsg is decodeMsg for the control socket's frames, then the
// same-node ones (decodeNodeMsg).
func decodeLocalMsg(t Type, d *decoder) Msg {
	switch t {
	case TypeRegister:
		m := new(Register)
		m.decode(d)
		return m
	case TypeUnregister:
		m := new(Unregister)
		m.decode(d)
		return m
	case TypeSubmit:
		m := new(Submit)
		m.decode(d)
		return m
	case TypeSubmitWait:
		m := new(SubmitWait)
		m.Submit.decode(d)
		return m
	case TypeSubmitHead:
		m := new(SubmitHead)
		m.decode(d)
		return m
	case TypeSubmitMore:
		m := new(SubmitMore)
		m.decode(d)
		return m
	case TypeSubmitted:
		m := new(Submitted)
		m.decode(d)
		return m
	case TypeWait:
		m := new(Wait)
		m.decode(d)
		return m
	case TypeStatus:
		m := new(Status)
		m.decode(d)
		return m
	case TypeXferStatus:
		m := new(XferStatus)
		m.decode(d)
		return m
	case TypeCancel:
		m := new(Cancel)
		m.decode(d)
		return m
	case TypeSubscribe:
		m := new(Subscribe)
		m.decode(d)
		return m
	case TypeNotify:
		m := new(Notify)
		m.decode(d)
		return m
	case TypeQuery:
		m := new(Query)
		m.decode(d)
		return m
	case TypeQueryReply:
		m := new(QueryReply)
		m.decode(d)
		return m
	case TypeOK:
		m := new(OK)
		m.decode(d)
		return m
	case TypeFail:
		m := new(Fail)
		m.decode(d)
		return m
	}
	return decodeNodeMsg(t, d)
}
