package wire

// Codecs of the same-node frames: fields in declaration order.

// AppendBody appends the encoded NodeInfo body to dst.
func (m *NodeInfo) AppendBody(dst []byte) []byte {
	dst = appendStr(dst, m.Socket)
	return appendStr(dst, m.Device)
}

func (m *NodeInfo) decode(d *decoder) {
	m.Socket = d.str("Socket", MaxName)
	m.Device = d.str("Device", MaxName)
}

// AppendBody appends the encoded Revoke body to dst.
func (m *Revoke) AppendBody(dst []byte) []byte { return appendU64(dst, m.RegionID) }

func (m *Revoke) decode(d *decoder) { m.RegionID = d.u64("RegionID") }

// AppendBody appends the encoded LinkWake body (none) to dst.
func (m *LinkWake) AppendBody(dst []byte) []byte { return dst }

// AppendBody appends the encoded NodeHello body to dst.
func (m *NodeHello) AppendBody(dst []byte) []byte {
	dst = append(dst, m.SessionID[:]...)
	return append(dst, m.Proof[:]...)
}

func (m *NodeHello) decode(d *decoder) {
	d.array("SessionID", m.SessionID[:])
	d.array("Proof", m.Proof[:])
}

// AppendBody appends the encoded HandleRequest body to dst.
func (m *HandleRequest) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Transfer)
	dst = appendU8(dst, uint8(m.Dir))
	dst = appendStr(dst, m.Tag)
	return appendStrs(dst, m.Regions)
}

func (m *HandleRequest) decode(d *decoder) {
	m.Transfer = d.u64("Transfer")
	m.Dir = d.direction("Dir")
	m.Tag = d.str("Tag", MaxTag)
	m.Regions = d.strs("Regions", MaxNames, MaxName)
}

// AppendBody appends the encoded RegionHandle body to dst.
func (m *RegionHandle) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Transfer)
	dst = appendU32(dst, m.Index)
	dst = appendU64(dst, m.RegionID)
	dst = appendU8(dst, m.Kind)
	dst = appendU8(dst, uint8(m.Access))
	dst = appendStr(dst, m.AllocKey)
	dst = appendU64(dst, m.AllocSize)
	dst = appendU64(dst, m.Offset)
	dst = appendU64(dst, m.Length)
	dst = appendStr(dst, m.Device)
	return appendBytes16(dst, m.Raw)
}

func (m *RegionHandle) decode(d *decoder) {
	m.Transfer = d.u64("Transfer")
	m.Index = d.u32("Index")
	m.RegionID = d.u64("RegionID")
	m.Kind = d.u8("Kind")
	m.Access = d.access("Access")
	m.AllocKey = d.str("AllocKey", MaxName)
	m.AllocSize = d.u64("AllocSize")
	m.Offset = d.u64("Offset")
	m.Length = d.u64("Length")
	if d.err == nil && (m.Offset > m.AllocSize || m.Length > m.AllocSize-m.Offset) {
		d.fail(ErrMalformed, "Length", "offset %d + length %d is past the allocation's %d B", m.Offset, m.Length, m.AllocSize)
	}
	m.Device = d.str("Device", MaxName)
	m.Raw = d.bytes16("Raw", MaxHandleBytes)
}

// AppendBody appends the encoded DirectDone body to dst.
func (m *DirectDone) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Transfer)
	return appendU64(dst, m.Bytes)
}

func (m *DirectDone) decode(d *decoder) {
	m.Transfer = d.u64("Transfer")
	m.Bytes = d.u64("Bytes")
}

// AppendBody appends the encoded ShmRing body to dst.
func (m *ShmRing) AppendBody(dst []byte) []byte {
	dst = appendU32(dst, m.Slots)
	return appendU32(dst, m.SlotSize)
}

func (m *ShmRing) decode(d *decoder) {
	m.Slots = d.u32("Slots")
	m.SlotSize = d.u32("SlotSize")
}

// AppendBody appends the encoded ShmChunk body to dst.
func (m *ShmChunk) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Transfer)
	dst = appendU32(dst, m.Slot)
	dst = appendU32(dst, m.Index)
	dst = appendU32(dst, m.Count)
	dst = appendU32(dst, m.PayloadLen)
	n := listLen(len(m.Segs))
	dst = appendU32(dst, uint32(n))
	for _, s := range m.Segs[:n] {
		dst = appendU32(dst, s.Region)
		dst = appendU32(dst, s.Len)
		dst = appendU64(dst, s.Offset)
	}
	return dst
}

func (m *ShmChunk) decode(d *decoder) {
	m.Transfer = d.u64("Transfer")
	m.Slot = d.u32("Slot")
	m.Index = d.u32("Index")
	m.Count = d.u32("Count")
	m.PayloadLen = d.u32("PayloadLen")
	n := d.count("Segs", MaxChunkSegs, ChunkSegSize)
	if d.err != nil || n == 0 {
		return
	}
	m.Segs = make([]ChunkSeg, n)
	var sum uint64
	for i := range m.Segs {
		d.idx = i
		s := &m.Segs[i]
		s.Region = d.u32("Segs[].Region")
		s.Len = d.u32("Segs[].Len")
		s.Offset = d.u64("Segs[].Offset")
		if d.err == nil && s.Offset+uint64(s.Len) < s.Offset {
			d.fail(ErrOverflow, "Segs[].Offset", "offset %d + length %d", s.Offset, s.Len)
		}
		sum += uint64(s.Len)
	}
	if d.err == nil && sum != uint64(m.PayloadLen) {
		d.fail(ErrMalformed, "Segs", "lengths add up to %d, PayloadLen is %d", sum, m.PayloadLen)
	}
	if d.err != nil {
		m.Segs = nil
	}
}

// AppendBody appends the encoded ShmLanded body to dst.
func (m *ShmLanded) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Transfer)
	dst = appendU32(dst, m.Slot)
	dst = appendU32(dst, m.Index)
	dst = appendU16(dst, uint16(m.Code))
	return appendText(dst, m.Message)
}

func (m *ShmLanded) decode(d *decoder) {
	m.Transfer = d.u64("Transfer")
	m.Slot = d.u32("Slot")
	m.Index = d.u32("Index")
	m.Code = Code(d.u16("Code"))
	m.Message = d.str("Message", MaxMessage)
}

// decodeNodeMsg is decodeMsg for the same-node frames. The calls are
// direct (no interface), so that the decoder stays on the caller's stack.
func decodeNodeMsg(t Type, d *decoder) Msg {
	switch t {
	case TypeNodeInfo:
		m := new(NodeInfo)
		m.decode(d)
		return m
	case TypeRevoke:
		m := new(Revoke)
		m.decode(d)
		return m
	case TypeNodeHello:
		m := new(NodeHello)
		m.decode(d)
		return m
	case TypeHandleRequest:
		m := new(HandleRequest)
		m.decode(d)
		return m
	case TypeRegionHandle:
		m := new(RegionHandle)
		m.decode(d)
		return m
	case TypeDirectDone:
		m := new(DirectDone)
		m.decode(d)
		return m
	case TypeShmRing:
		m := new(ShmRing)
		m.decode(d)
		return m
	case TypeShmChunk:
		m := new(ShmChunk)
		m.decode(d)
		return m
	case TypeShmLanded:
		m := new(ShmLanded)
		m.decode(d)
		return m
	case TypeLinkWake:
		return new(LinkWake)
	}
	return decodeKVMsg(t, d)
}
