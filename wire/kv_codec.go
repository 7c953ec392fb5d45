package wire

import "unsafe"

// KV frame codecs: fields in declaration order. Block tables and layer
// lists are u32 lists with a u32 count; their limits bound what a decoder
// allocates.

const kvPartMinSize = minStrSize + 4 + 1 + 4*8

// appendU32s appends a u32 count and the list. Block tables of 65,536
// ids go by one copy on little-endian hosts, not a call per id.
func appendU32s(b []byte, vs []uint32) []byte {
	n := listLen(len(vs))
	b = appendU32(b, uint32(n))
	if n == 0 {
		return b
	}
	if nativeLE {
		return append(b, unsafe.Slice((*byte)(unsafe.Pointer(&vs[0])), 4*n)...)
	}
	for _, v := range vs[:n] {
		b = appendU32(b, v)
	}
	return b
}

// u32s reads a u32 list, nil when empty.
func (d *decoder) u32s(field string, max int) []uint32 {
	n := d.count(field, max, 4)
	if n == 0 {
		return nil
	}
	p := d.take(field, 4*n)
	if p == nil {
		return nil
	}
	vs := make([]uint32, n)
	if nativeLE {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&vs[0])), 4*n), p)
		return vs
	}
	for i := range vs {
		vs[i] = le.Uint32(p[4*i:])
	}
	return vs
}

// nativeLE: this host stores integers little-endian, as the wire does.
var nativeLE = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

func appendKVLayout(b []byte, l *KVLayout) []byte {
	b = appendU8(b, l.DType)
	b = appendU32(b, l.BlockSize)
	b = appendU32(b, l.Blocks)
	b = appendU32(b, l.Heads)
	b = appendU32(b, l.HeadLo)
	b = appendU32(b, l.HeadHi)
	n := listLen(len(l.Parts))
	b = appendU32(b, uint32(n))
	for i := range l.Parts[:n] {
		p := &l.Parts[i]
		b = appendStr(b, p.Name)
		b = appendU32(b, p.Width)
		b = appendU8(b, p.Tensor)
		b = appendU64(b, p.Offset)
		b = appendU64(b, p.BlockStride)
		b = appendU64(b, p.SlotStride)
		b = appendU64(b, p.HeadStride)
	}
	return b
}

func (d *decoder) kvLayout(field string, l *KVLayout) {
	l.DType = d.u8(field + ".DType")
	l.BlockSize = d.u32(field + ".BlockSize")
	l.Blocks = d.u32(field + ".Blocks")
	l.Heads = d.u32(field + ".Heads")
	l.HeadLo = d.u32(field + ".HeadLo")
	l.HeadHi = d.u32(field + ".HeadHi")
	n := d.count(field+".Parts", MaxKVParts, kvPartMinSize)
	if n == 0 {
		return
	}
	l.Parts = make([]KVPart, n)
	for i := range l.Parts {
		d.idx = i
		p := &l.Parts[i]
		p.Name = d.str(field+".Parts[].Name", MaxName)
		p.Width = d.u32(field + ".Parts[].Width")
		p.Tensor = d.u8(field + ".Parts[].Tensor")
		p.Offset = d.u64(field + ".Parts[].Offset")
		p.BlockStride = d.u64(field + ".Parts[].BlockStride")
		p.SlotStride = d.u64(field + ".Parts[].SlotStride")
		p.HeadStride = d.u64(field + ".Parts[].HeadStride")
		if d.err != nil {
			l.Parts = nil
			return
		}
	}
}

func appendKVShape(b []byte, s *KVShape) []byte {
	b = appendU8(b, s.DType)
	b = appendU32(b, s.BlockSize)
	b = appendU32(b, s.Blocks)
	b = appendU32(b, s.Heads)
	b = appendU32(b, s.HeadLo)
	b = appendU32(b, s.HeadHi)
	b = appendU32s(b, s.Widths)
	return appendU8(b, s.Flags)
}

func (d *decoder) kvShape(field string, s *KVShape) {
	s.DType = d.u8(field + ".DType")
	s.BlockSize = d.u32(field + ".BlockSize")
	s.Blocks = d.u32(field + ".Blocks")
	s.Heads = d.u32(field + ".Heads")
	s.HeadLo = d.u32(field + ".HeadLo")
	s.HeadHi = d.u32(field + ".HeadHi")
	s.Widths = d.u32s(field+".Widths", MaxKVParts)
	s.Flags = d.u8(field + ".Flags")
	if d.err == nil && s.Flags&^KVHeadOuter != 0 {
		d.fail(ErrMalformed, field+".Flags", "unknown flags %#x", s.Flags&^KVHeadOuter)
	}
}

// AppendBody appends the encoded RegisterKV body to dst.
func (m *RegisterKV) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	dst = appendStr(dst, m.Name)
	dst = appendKVLayout(dst, &m.Layout)
	n := listLen(len(m.Layers))
	dst = appendU32(dst, uint32(n))
	for _, l := range m.Layers[:n] {
		dst = appendStrs(dst, l)
	}
	return dst
}

func (m *RegisterKV) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Name = d.str("Name", MaxName)
	d.kvLayout("Layout", &m.Layout)
	n := d.count("Layers", MaxKVLayers, 4)
	if n == 0 {
		return
	}
	m.Layers = make([][]string, n)
	for i := range m.Layers {
		d.idx = i
		m.Layers[i] = d.strs("Layers[]", MaxKVParts, MaxName)
		if d.err != nil {
			m.Layers = nil
			return
		}
	}
}

// AppendBody appends the encoded SubmitKV body to dst.
func (m *SubmitKV) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Req)
	dst = appendStr(dst, m.Route)
	dst = appendStr(dst, m.Peer)
	dst = appendU8(dst, uint8(m.Dir))
	dst = appendU8(dst, m.Checksum)
	dst = appendStr(dst, m.Tag)
	dst = appendStr(dst, m.Local)
	dst = appendStr(dst, m.Remote)
	dst = appendU32s(dst, m.Layers)
	dst = appendU32s(dst, m.RemoteLayers)
	dst = appendU32s(dst, m.LocalBlocks)
	dst = appendU32s(dst, m.RemoteBlocks)
	dst = appendU32(dst, m.LocalFirst)
	dst = appendU32(dst, m.RemoteFirst)
	dst = appendU32(dst, m.Tokens)
	dst = appendU32(dst, m.HeadLo)
	dst = appendU32(dst, m.HeadHi)
	return appendOptKey(dst, m.Key)
}

func (m *SubmitKV) decode(d *decoder) {
	m.Req = d.u64("Req")
	m.Route = d.str("Route", MaxName)
	m.Peer = d.str("Peer", MaxName)
	m.Dir = d.direction("Dir")
	m.Checksum = d.u8("Checksum")
	if d.err == nil && m.Checksum > ChecksumOff {
		d.fail(ErrMalformed, "Checksum", "unknown checksum choice %d", m.Checksum)
	}
	m.Tag = d.str("Tag", MaxTag)
	m.Local = d.str("Local", MaxName)
	m.Remote = d.str("Remote", MaxName)
	m.Layers = d.u32s("Layers", MaxKVLayers)
	m.RemoteLayers = d.u32s("RemoteLayers", MaxKVLayers)
	m.LocalBlocks = d.u32s("LocalBlocks", MaxKVBlocks)
	m.RemoteBlocks = d.u32s("RemoteBlocks", MaxKVBlocks)
	m.LocalFirst = d.u32("LocalFirst")
	m.RemoteFirst = d.u32("RemoteFirst")
	m.Tokens = d.u32("Tokens")
	m.HeadLo = d.u32("HeadLo")
	m.HeadHi = d.u32("HeadHi")
	if d.err == nil && len(m.RemoteLayers) != 0 && len(m.RemoteLayers) != len(m.Layers) {
		d.fail(ErrMalformed, "RemoteLayers", "%d remote layers for %d local ones", len(m.RemoteLayers), len(m.Layers))
	}
	m.Key = d.optKey("Key")
}

func (m *KVRequest) appendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Transfer)
	dst = appendStr(dst, m.Tag)
	dst = appendU64(dst, m.Total)
	dst = appendStr(dst, m.Name)
	dst = appendU32s(dst, m.Layers)
	dst = appendU32s(dst, m.Blocks)
	dst = appendU32(dst, m.First)
	dst = appendU32(dst, m.Tokens)
	dst = appendU32(dst, m.HeadLo)
	dst = appendU32(dst, m.HeadHi)
	dst = appendU8(dst, m.Order)
	dst = appendKVShape(dst, &m.Shape)
	dst = appendKVShape(dst, &m.PeerShape)
	return appendOptKey(dst, m.Key)
}

func (m *KVRequest) decode(d *decoder) {
	m.Transfer = d.u64("Transfer")
	m.Tag = d.str("Tag", MaxTag)
	m.Total = d.u64("Total")
	m.Name = d.str("Name", MaxName)
	m.Layers = d.u32s("Layers", MaxKVLayers)
	m.Blocks = d.u32s("Blocks", MaxKVBlocks)
	m.First = d.u32("First")
	m.Tokens = d.u32("Tokens")
	m.HeadLo = d.u32("HeadLo")
	m.HeadHi = d.u32("HeadHi")
	m.Order = d.u8("Order")
	if d.err == nil && m.Order > KVBlockMajor {
		d.fail(ErrMalformed, "Order", "unknown order %d", m.Order)
	}
	d.kvShape("Shape", &m.Shape)
	d.kvShape("PeerShape", &m.PeerShape)
	m.Key = d.optKey("Key")
}

// AppendBody appends the encoded KVAnnounce body to dst.
func (m *KVAnnounce) AppendBody(dst []byte) []byte { return m.appendBody(dst) }

// AppendBody appends the encoded KVPull body to dst.
func (m *KVPull) AppendBody(dst []byte) []byte { return m.appendBody(dst) }

// AppendBody appends the encoded KVInfoRequest body to dst.
func (m *KVInfoRequest) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Seq)
	return appendStr(dst, m.Name)
}

func (m *KVInfoRequest) decode(d *decoder) {
	m.Seq = d.u64("Seq")
	m.Name = d.str("Name", MaxName)
}

// AppendBody appends the encoded KVInfo body to dst.
func (m *KVInfo) AppendBody(dst []byte) []byte {
	dst = appendU64(dst, m.Seq)
	dst = appendStr(dst, m.Name)
	dst = appendBool(dst, m.Found)
	dst = appendU32(dst, m.Layers)
	return appendKVShape(dst, &m.Shape)
}

func (m *KVInfo) decode(d *decoder) {
	m.Seq = d.u64("Seq")
	m.Name = d.str("Name", MaxName)
	m.Found = d.boolean("Found")
	m.Layers = d.u32("Layers")
	d.kvShape("Shape", &m.Shape)
}

// decodeKVMsg is decodeMsg for the KV frames, then the tickets' (decodeTicketMsg).
func decodeKVMsg(t Type, d *decoder) Msg {
	switch t {
	case TypeRegisterKV:
		m := new(RegisterKV)
		m.decode(d)
		return m
	case TypeSubmitKV:
		m := new(SubmitKV)
		m.decode(d)
		return m
	case TypeKVAnnounce:
		m := new(KVAnnounce)
		m.decode(d)
		return m
	case TypeKVPull:
		m := new(KVPull)
		m.decode(d)
		return m
	case TypeKVInfoRequest:
		m := new(KVInfoRequest)
		m.decode(d)
		return m
	case TypeKVInfo:
		m := new(KVInfo)
		m.decode(d)
		return m
	}
	return decodeTicketMsg(t, d)
}
