package wire

import "math"

// Peer protocol message codecs: fields in declaration order.

// AppendBody appends the encoded Hello body to dst.
func (m *Hello) AppendBody(dst []byte) []byte {
	dst = appendU8(dst, m.VersionMin)
	dst = appendU8(dst, m.VersionMax)
	dst = appendStr(dst, m.NodeName)
	dst = appendStr(dst, m.HostID)
	dst = append(dst, m.Nonce[:]...)
	dst = appendU32(dst, m.SlotSize)
	return appendU32(dst, m.Window)
}

func (m *Hello) decode(d *decoder) {
	m.VersionMin = d.u8("VersionMin")
	m.VersionMax = d.u8("VersionMax")
	if d.err == nil && m.VersionMin > m.VersionMax {
		d.fail(ErrMalformed, "VersionMin", "%d above VersionMax %d", m.VersionMin, m.VersionMax)
	}
	m.NodeName = d.str("NodeName", MaxName)
	m.HostID = d.str("HostID", MaxName)
	d.array("Nonce", m.Nonce[:])
	m.SlotSize = d.u32("SlotSize")
	m.Window = d.u32("Window")
}

// AppendBody appends the encoded Challenge body to dst.
func (m *Challenge) AppendBody(dst []byte) []byte {
	dst = appendU8(dst, m.Version)
	dst = appendStr(dst, m.NodeName)
	dst = appendStr(dst, m.HostID)
	dst = append(dst, m.Nonce[:]...)
	return append(dst, m.Proof[:]...)
}

func (m *Challenge) decode(d *decoder) {
	m.Version = d.u8("Version")
	m.NodeName = d.str("NodeName", MaxName)
	m.HostID = d.str("HostID", MaxName)
	d.array("Nonce", m.Nonce[:])
	d.array("Proof", m.Proof[:])
}

// AppendBody appends the encoded Auth body to dst.
func (m *Auth) AppendBody(dst []byte) []byte { return append(dst, m.Proof[:]...) }

func (m *Auth) decode(d *decoder) { d.array("Proof", m.Proof[:]) }

// AppendBody appends the encoded Welcome body to dst.
func (m *Welcome) AppendBody(dst []byte) []byte {
	dst = append(dst, m.SessionID[:]...)
	dst = appendU32(dst, m.SlotSize)
	dst = appendU32(dst, m.Window)
	return appendU16(dst, m.MaxStreams)
}

func (m *Welcome) decode(d *decoder) {
	d.array("SessionID", m.SessionID[:])
	m.SlotSize = d.u32("SlotSize")
	m.Window = d.u32("Window")
	m.MaxStreams = d.u16("MaxStreams")
}

// AppendBody appends the encoded DataHello body to dst.
func (m *DataHello) AppendBody(dst []byte) []byte {
	dst = append(dst, m.SessionID[:]...)
	dst = appendU16(dst, m.Stream)
	return append(dst, m.Proof[:]...)
}

func (m *DataHello) decode(d *decoder) {
	d.array("SessionID", m.SessionID[:])
	m.Stream = d.u16("Stream")
	d.array("Proof", m.Proof[:])
}

// AppendBody appends the encoded DataAccept body to dst.
func (m *DataAccept) AppendBody(dst []byte) []byte { return appendU16(dst, m.Stream) }

func (m *DataAccept) decode(d *decoder) { m.Stream = d.u16("Stream") }

// AppendBody appends the encoded CatalogRequest body to dst.
func (m *CatalogRequest) AppendBody(dst []byte) []byte { return appendU64(dst, m.Seq) }

func (m *CatalogRequest) decode(d *decoder) { m.Seq = d.u64("Seq") }

// AppendBody appends the encoded Catalog body to dst.
func (m *Catalog) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Seq)
	n := listLen(len(m.Regions))
	dst = appendU32(dst, uint32(n))
	for i := range m.Regions[:n] {
		r := &m.Regions[i]
		dst = appendStr(dst, r.Name)
		dst = appendU64(dst, r.Size)
		dst = appendU8(dst, uint8(r.Access))
		dst = appendStr(dst, r.Device)
	}
	return dst
}

func (m *Catalog) decode(d *decoder) {
	m.Seq = d.u64("Seq")
	n := d.count("Regions", MaxRegions, regionInfoMinSize)
	if n == 0 {
		return
	}
	m.Regions = make([]RegionInfo, n)
	for i := range m.Regions {
		d.idx = i
		r := &m.Regions[i]
		r.Name = d.str("Regions[].Name", MaxName)
		r.Size = d.u64("Regions[].Size")
		r.Access = d.access("Regions[].Access")
		r.Device = d.str("Regions[].Device", MaxName)
		if d.err != nil {
			return
		}
	}
}

// access reads an Access bit set and rejects unknown bits.
func (d *decoder) access(field string) Access {
	a := Access(d.u8(field))
	if a&^AccessAll != 0 {
		d.fail(ErrMalformed, field, "unknown access bits %#x", uint8(a&^AccessAll))
	}
	return a
}

// AppendBody appends the encoded Announce body to dst.
func (m *Announce) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Transfer)
	dst = appendStr(dst, m.Tag)
	dst = appendU64(dst, m.Total)
	dst = appendStrs(dst, m.Regions)
	n := listLen(len(m.Ends))
	dst = appendU32(dst, uint32(n))
	for _, e := range m.Ends[:n] {
		dst = appendU64(dst, e)
	}
	return dst
}

func (m *Announce) decode(d *decoder) {
	m.Transfer = d.u64("Transfer")
	m.Tag = d.str("Tag", MaxTag)
	m.Total = d.u64("Total")
	m.Regions = d.strs("Regions", MaxNames, MaxName)
	n := d.count("Ends", MaxNames, 8)
	if d.err == nil && n != len(m.Regions) {
		d.fail(ErrMalformed, "Ends", "count %d, want %d (one per region)", n, len(m.Regions))
	}
	if d.err != nil || n == 0 {
		return
	}
	m.Ends = make([]uint64, n)
	for i := range m.Ends {
		m.Ends[i] = d.u64("Ends[]")
	}
}

// AppendBody appends the encoded PullRequest body to dst.
func (m *PullRequest) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Transfer)
	dst = appendStr(dst, m.Tag)
	dst = appendStrs(dst, m.SrcRegions)
	n := listLen(len(m.Ops))
	dst = appendU32(dst, uint32(n))
	for i := range m.Ops[:n] {
		op := &m.Ops[i]
		dst = appendU32(dst, op.Src)
		dst = appendU32(dst, op.Dst)
		dst = appendU64(dst, op.SrcOff)
		dst = appendU64(dst, op.DstOff)
		dst = appendU64(dst, op.Len)
	}
	return dst
}

func (m *PullRequest) decode(d *decoder) {
	m.Transfer = d.u64("Transfer")
	m.Tag = d.str("Tag", MaxTag)
	m.SrcRegions = d.strs("SrcRegions", MaxNames, MaxName)
	n := d.count("Ops", MaxOps, opSize)
	if d.err != nil || n == 0 {
		return
	}
	m.Ops = make([]Op, n)
	for i := range m.Ops {
		d.idx = i
		op := &m.Ops[i]
		op.Src = d.u32("Ops[].Src")
		op.Dst = d.u32("Ops[].Dst")
		op.SrcOff = d.u64("Ops[].SrcOff")
		op.DstOff = d.u64("Ops[].DstOff")
		op.Len = d.u64("Ops[].Len")
		if d.err != nil {
			return
		}
		switch {
		case int64(op.Src) >= int64(len(m.SrcRegions)):
			d.fail(ErrMalformed, "Ops[].Src", "index %d out of range (%d source regions)", op.Src, len(m.SrcRegions))
		case op.Len == 0:
			d.fail(ErrMalformed, "Ops[].Len", "zero length")
		case op.SrcOff > math.MaxUint64-op.Len:
			d.fail(ErrOverflow, "Ops[].SrcOff", "offset %d + length %d overflows", op.SrcOff, op.Len)
		case op.DstOff > math.MaxUint64-op.Len:
			d.fail(ErrOverflow, "Ops[].DstOff", "offset %d + length %d overflows", op.DstOff, op.Len)
		}
		if d.err != nil {
			return
		}
	}
}

// AppendBody appends the encoded Accept body to dst.
func (m *Accept) AppendBody(dst []byte) []byte { return appendU64(dst, m.Transfer) }

func (m *Accept) decode(d *decoder) { m.Transfer = d.u64("Transfer") }

// AppendBody appends the encoded Ack body to dst. It does not allocate when
// dst has room for 12 + 4*len(m.Chunks) more bytes.
func (m *Ack) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Transfer)
	n := listLen(len(m.Chunks))
	dst = appendU32(dst, uint32(n))
	for _, c := range m.Chunks[:n] {
		dst = appendU32(dst, c)
	}
	return dst
}

func (m *Ack) decode(d *decoder) {
	m.Transfer = d.u64("Transfer")
	n := d.count("Chunks", MaxAckChunks, 4)
	if d.err != nil {
		m.Chunks = m.Chunks[:0]
		return
	}
	if n == 0 {
		m.Chunks = m.Chunks[:0]
		return
	}
	if cap(m.Chunks) >= n {
		m.Chunks = m.Chunks[:n]
	} else {
		m.Chunks = make([]uint32, n)
	}
	for i := range m.Chunks {
		m.Chunks[i] = d.u32("Chunks[]")
	}
}

// DecodeAck decodes an Ack body into a, reusing the capacity of a.Chunks, so
// that a receiver that keeps one Ack decodes without allocating. On error a
// holds no chunks.
func DecodeAck(body []byte, a *Ack) error {
	d := decoder{b: body, t: TypeAck}
	a.decode(&d)
	if err := d.finish(); err != nil {
		a.Transfer, a.Chunks = 0, a.Chunks[:0]
		return err
	}
	return nil
}

// AppendBody appends the encoded Nack body to dst.
func (m *Nack) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Transfer)
	dst = appendU16(dst, uint16(m.Code))
	return appendText(dst, m.Message)
}

func (m *Nack) decode(d *decoder) {
	m.Transfer = d.u64("Transfer")
	m.Code = Code(d.u16("Code"))
	m.Message = d.str("Message", MaxMessage)
}

// AppendBody appends the encoded Credit body to dst.
func (m *Credit) AppendBody(dst []byte) []byte { return appendU32(dst, m.Grant) }

func (m *Credit) decode(d *decoder) { m.Grant = d.u32("Grant") }

// AppendBody appends the encoded Resend body to dst.
func (m *Resend) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Transfer)
	return appendU32(dst, m.Chunk)
}

func (m *Resend) decode(d *decoder) {
	m.Transfer = d.u64("Transfer")
	m.Chunk = d.u32("Chunk")
}

// AppendBody appends the encoded Heartbeat body to dst.
func (m *Heartbeat) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Seq)
	return appendU64(dst, uint64(m.UnixNanos))
}

func (m *Heartbeat) decode(d *decoder) {
	m.Seq = d.u64("Seq")
	m.UnixNanos = int64(d.u64("UnixNanos"))
}

// AppendBody appends the encoded Goodbye body to dst.
func (m *Goodbye) AppendBody(dst []byte) []byte { return appendText(dst, m.Reason) }

func (m *Goodbye) decode(d *decoder) { m.Reason = d.str("Reason", MaxMessage) }

// AppendBody appends the encoded Error body to dst.
func (m *Error) AppendBody(dst []byte) []byte {
	dst = appendU16(dst, uint16(m.Code))
	return appendText(dst, m.Message)
}

func (m *Error) decode(d *decoder) {
	m.Code = Code(d.u16("Code"))
	m.Message = d.str("Message", MaxMessage)
}

// decodePeerMsg is decodeMsg for the peer protocol's frames, then the
// same-node ones (decodeNodeMsg).
func decodePeerMsg(t Type, d *decoder) Msg {
	switch t {
	case TypeHello:
		m := new(Hello)
		m.decode(d)
		return m
	case TypeChallenge:
		m := new(Challenge)
		m.decode(d)
		return m
	case TypeAuth:
		m := new(Auth)
		m.decode(d)
		return m
	case TypeWelcome:
		m := new(Welcome)
		m.decode(d)
		return m
	case TypeDataHello:
		m := new(DataHello)
		m.decode(d)
		return m
	case TypeDataAccept:
		m := new(DataAccept)
		m.decode(d)
		return m
	case TypeCatalogRequest:
		m := new(CatalogRequest)
		m.decode(d)
		return m
	case TypeCatalog:
		m := new(Catalog)
		m.decode(d)
		return m
	case TypeAnnounce:
		m := new(Announce)
		m.decode(d)
		return m
	case TypePullRequest:
		m := new(PullRequest)
		m.decode(d)
		return m
	case TypeAccept:
		m := new(Accept)
		m.decode(d)
		return m
	case TypeAck:
		m := new(Ack)
		m.decode(d)
		return m
	case TypeNack:
		m := new(Nack)
		m.decode(d)
		return m
	case TypeCredit:
		m := new(Credit)
		m.decode(d)
		return m
	case TypeResend:
		m := new(Resend)
		m.decode(d)
		return m
	case TypeHeartbeat:
		m := new(Heartbeat)
		m.decode(d)
		return m
	case TypeGoodbye:
		m := new(Goodbye)
		m.decode(d)
		return m
	case TypeError:
		m := new(Error)
		m.decode(d)
		return m
	}
	return decodeNodeMsg(t, d)
}
