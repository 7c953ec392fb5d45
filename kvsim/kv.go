package kvsim

import (
	"context"
	"fmt"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/wire"
)

// KV is a synthetic KV cache in one engine's layout (a kvlayout preset):
// every tensor of every layer is a region inside one Memory, at its own
// offset, and the whole is registered as a KV cache.
type KV struct {
	Name   string
	Layers int
	Layout kvlayout.Layout
	lens   []uint64   // byte length of each tensor of a layer
	offs   [][]uint64 // offs[l][t]: tensor t of layer l inside mem
	mem    Memory
}

// NewKV lays out layers layers of preset in host memory (a memfd the
// hostmem device imports).
func NewKV(name, preset string, p kvlayout.Params, layers int) (*KV, error) {
	l, lens, err := kvlayout.Preset(preset, p)
	if err != nil {
		return nil, err
	}
	k := &KV{Name: name, Layers: layers, Layout: l, lens: lens}
	size := k.place(4096)
	mem, err := NewHostMemory(name, size)
	if err != nil {
		return nil, err
	}
	k.mem = mem
	return k, nil
}

// NewKVOn is NewKV in mem, which must hold KVBytes of the same arguments.
func NewKVOn(mem Memory, name, preset string, p kvlayout.Params, layers int) (*KV, error) {
	l, lens, err := kvlayout.Preset(preset, p)
	if err != nil {
		return nil, err
	}
	k := &KV{Name: name, Layers: layers, Layout: l, lens: lens, mem: mem}
	if need := k.place(4096); need > mem.Size() {
		return nil, fmt.Errorf("kvsim: %s needs %d B, the memory has %d", name, need, mem.Size())
	}
	return k, nil
}

// place gives every tensor its offset, each after a guard gap so that a
// write past a tensor lands in bytes the checks see, and returns the size.
func (k *KV) place(guard uint64) uint64 {
	off := guard
	k.offs = make([][]uint64, k.Layers)
	for l := range k.offs {
		k.offs[l] = make([]uint64, len(k.lens))
		for t, n := range k.lens {
			k.offs[l][t] = off
			off += (n+255)&^255 + guard
		}
	}
	return off
}

// Close frees the memory.
func (k *KV) Close() error { return k.mem.Close() }

// Memory is where the cache lives.
func (k *KV) Memory() Memory { return k.mem }

// Region names tensor t of layer l.
func (k *KV) Region(l, t int) string { return fmt.Sprintf("%s/%d/%d", k.Name, l, t) }

// Register registers every tensor as a region and the cache as a KV cache.
func (k *KV) Register(ctx context.Context, cl *client.Client, access wire.Access) error {
	names := make([][]string, k.Layers)
	for l := range names {
		for t, n := range k.lens {
			name := k.Region(l, t)
			if err := cl.Register(ctx, k.mem.Region(name, k.offs[l][t], n, access)); err != nil {
				return fmt.Errorf("register %s: %w", name, err)
			}
			names[l] = append(names[l], name)
		}
	}
	if err := cl.RegisterKV(ctx, k.Name, WireLayout(&k.Layout), names); err != nil {
		return fmt.Errorf("register KV cache %s: %w", k.Name, err)
	}
	return nil
}

// WireLayout is l as RegisterKV carries it.
func WireLayout(l *kvlayout.Layout) wire.KVLayout {
	w := wire.KVLayout{DType: uint8(l.DType), BlockSize: l.BlockSize, Blocks: l.Blocks, Heads: l.Heads,
		HeadLo: l.HeadLo, HeadHi: l.HeadHi, Parts: make([]wire.KVPart, len(l.Parts))}
	for i, p := range l.Parts {
		w.Parts[i] = wire.KVPart{Name: p.Name, Width: p.Width, Tensor: uint8(p.Tensor), Offset: p.Offset,
			BlockStride: p.BlockStride, SlotStride: p.SlotStride, HeadStride: p.HeadStride}
	}
	return w
}

// Fill writes pseudo-random bytes from seed over the whole memory.
func (k *KV) Fill(seed uint64) error {
	b := make([]byte, k.mem.Size())
	x := seed | 1
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		for j := 0; j < 8; j++ {
			b[i+j] = byte(x >> (8 * j))
		}
	}
	return k.mem.WriteAt(b, 0)
}

// Poison sets every byte to v.
func (k *KV) Poison(v byte) error {
	b := make([]byte, k.mem.Size())
	for i := range b {
		b[i] = v
	}
	return k.mem.WriteAt(b, 0)
}

// Snapshot copies the whole memory (device memory through ReadAt).
func (k *KV) Snapshot() ([]byte, error) {
	b := make([]byte, k.mem.Size())
	return b, k.mem.ReadAt(b, 0)
}

// KVMove is one KV transfer as both sides see it.
type KVMove struct {
	Layers         []int
	SrcTable       []uint32
	DstTable       []uint32
	SrcFirst       uint32
	DstFirst       uint32
	Tokens         uint32
	HeadLo, HeadHi uint32 // 0, 0: where both slices overlap
}

// side is the mapping of m on cache k (src: the sending side) and the
// tensors it indexes, for checking transfers with kvlayout's reference
// copier. host holds the cache's bytes (a Snapshot).
func (k *KV) side(host []byte, peer *KV, m *KVMove, src bool) (*kvlayout.Side, [][]byte, error) {
	lo, hi := m.HeadLo, m.HeadHi
	if lo == 0 && hi == 0 {
		lo, hi = kvlayout.Overlap(k.Layout, peer.Layout)
	}
	table, first := m.DstTable, m.DstFirst
	if src {
		table, first = m.SrcTable, m.SrcFirst
	}
	var tensors [][]byte
	regions := make([][]int, len(m.Layers))
	for i, l := range m.Layers {
		for t, n := range k.lens {
			regions[i] = append(regions[i], len(tensors))
			tensors = append(tensors, host[k.offs[l][t]:k.offs[l][t]+n])
		}
	}
	s, err := kvlayout.NewSide(kvlayout.SideSpec{Layout: k.Layout, Regions: regions, Table: table, FirstToken: uint64(first),
		Tokens: uint64(m.Tokens), HeadLo: lo, HeadHi: hi, Cols: kvlayout.Columns(k.Layout, peer.Layout)})
	return s, tensors, err
}

// Expect applies moves from src to an image of dst (want, a Snapshot of
// dst taken before them) with kvlayout's reference copier: afterwards want
// is what dst must hold, rows moved and every other byte untouched.
func Expect(src, dst *KV, want []byte, moves ...KVMove) error {
	sb, err := src.Snapshot()
	if err != nil {
		return err
	}
	for i := range moves {
		m := &moves[i]
		ss, st, err := src.side(sb, dst, m, true)
		if err != nil {
			return fmt.Errorf("move %d: source side: %w", i, err)
		}
		ds, dt, err := dst.side(want, src, m, false)
		if err != nil {
			return fmt.Errorf("move %d: destination side: %w", i, err)
		}
		buf := make([]byte, ss.Len())
		if err := kvlayout.Gather(ss, st, 0, buf); err != nil {
			return err
		}
		if err := kvlayout.Scatter(ds, dt, 0, buf); err != nil {
			return err
		}
	}
	return nil
}

// Submit is the SubmitKV of m from this side (local) to cache remote.
func (m *KVMove) Submit(route, tag string, dir wire.Direction, local, remote *KV) wire.SubmitKV {
	s := wire.SubmitKV{Route: route, Dir: dir, Tag: tag, Local: local.Name, Remote: remote.Name,
		LocalFirst: m.SrcFirst, RemoteFirst: m.DstFirst, Tokens: m.Tokens, HeadLo: m.HeadLo, HeadHi: m.HeadHi,
		LocalBlocks: m.SrcTable, RemoteBlocks: m.DstTable}
	if dir == wire.Pull {
		s.LocalFirst, s.RemoteFirst = m.DstFirst, m.SrcFirst
		s.LocalBlocks, s.RemoteBlocks = m.DstTable, m.SrcTable
	}
	for _, l := range m.Layers {
		s.Layers = append(s.Layers, uint32(l))
	}
	return s
}

// KVSize is the memory NewKVOn needs for layers layers of preset.
func KVSize(preset string, p kvlayout.Params, layers int) (uint64, error) {
	l, lens, err := kvlayout.Preset(preset, p)
	if err != nil {
		return 0, err
	}
	k := &KV{Layers: layers, Layout: l, lens: lens}
	return k.place(4096), nil
}

// ByteOps is m as byte ranges, for a cache whose peer has the same
// layout: one op per layer, part and block pair, each the block's rows of
// the part (the transfer a byte API would make of it). It needs whole
// blocks (m.Tokens a multiple of the block size, both firsts 0, all
// heads) and parts whose block rows are contiguous; ok is false otherwise.
// Route, Dir and Tag are left to the caller.
func (k *KV) ByteOps(remote *KV, m *KVMove) (t client.Transfer, ok bool) {
	l := &k.Layout
	bs := l.BlockSize
	if m.Tokens%bs != 0 || m.SrcFirst != 0 || m.DstFirst != 0 || l.HeadLo != 0 || l.HeadHi != l.Heads {
		return t, false
	}
	e := l.DType.Size()
	held := uint64(l.Held())
	for _, layer := range m.Layers {
		for _, p := range l.Parts {
			row := uint64(p.Width) * e
			if p.HeadStride != row || p.SlotStride != held*row {
				return t, false
			}
			t.LocalNames = append(t.LocalNames, k.Region(layer, p.Tensor))
			t.RemoteNames = append(t.RemoteNames, remote.Region(layer, p.Tensor))
			ri := uint32(len(t.LocalNames) - 1)
			for i := uint32(0); i < m.Tokens/bs; i++ {
				t.Ops = append(t.Ops, wire.LocalOp{Local: ri, Remote: ri, Len: uint64(bs) * p.SlotStride,
					LocalOff: p.Offset + uint64(m.SrcTable[i])*p.BlockStride, RemoteOff: p.Offset + uint64(m.DstTable[i])*p.BlockStride})
			}
		}
	}
	return t, true
}
