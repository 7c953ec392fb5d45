// Package kvsim is a synthetic paged KV cache for the demo, benchmarks and
// tests: an engine-side allocation in shared memory (a memfd, the hostmem
// backend's "device memory"), cut into per-layer regions that sit at a
// non-zero offset inside it, with builders for range and scattered-block
// transfers and byte-exact verification.
//
// It plays the engine's part only; it never talks to peers.
package kvsim

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/hostmem"
	"github.com/stage-kv/stage/wire"
)

// Cache is Layers regions of LayerBytes each, laid out after Guard bytes
// inside one shared allocation (with Guard bytes after them too, so a
// write past a region shows).
type Cache struct {
	Name       string
	Layers     int
	LayerBytes uint64
	Guard      uint64
	mem        *hostmem.Shared
}

// New allocates a cache.
func New(name string, layers int, layerBytes, guard uint64) (*Cache, error) {
	if layers <= 0 || layerBytes == 0 {
		return nil, fmt.Errorf("kvsim: %d layers of %d B", layers, layerBytes)
	}
	size := 2*guard + uint64(layers)*layerBytes
	m, err := hostmem.NewShared(name, int(size))
	if err != nil {
		return nil, err
	}
	return &Cache{Name: name, Layers: layers, LayerBytes: layerBytes, Guard: guard, mem: m}, nil
}

// Close frees the allocation (the sidecar keeps its own mapping until it
// unregisters).
func (c *Cache) Close() error { return c.mem.Close() }

// Region returns layer i's region name.
func (c *Cache) Region(i int) string { return fmt.Sprintf("%s/%d", c.Name, i) }

// Regions returns every layer's region name.
func (c *Cache) Regions() []string {
	ns := make([]string, c.Layers)
	for i := range ns {
		ns[i] = c.Region(i)
	}
	return ns
}

// Layer returns layer i's bytes.
func (c *Cache) Layer(i int) []byte {
	off := c.Guard + uint64(i)*c.LayerBytes
	return c.mem.Bytes()[off : off+c.LayerBytes]
}

// All returns the whole allocation, guards included.
func (c *Cache) All() []byte { return c.mem.Bytes() }

// Register registers every layer with the sidecar behind cl.
func (c *Cache) Register(ctx context.Context, cl *client.Client, access wire.Access) error {
	for i := 0; i < c.Layers; i++ {
		err := cl.Register(ctx, client.Region{Name: c.Region(i), Handle: uint8(device.HandleMemfd), Access: access,
			AllocSize: uint64(c.mem.Size()), Offset: c.Guard + uint64(i)*c.LayerBytes, Length: c.LayerBytes, FD: c.mem.FD()})
		if err != nil {
			return err
		}
	}
	return nil
}

// Unregister removes every layer's region.
func (c *Cache) Unregister(ctx context.Context, cl *client.Client) error {
	for i := 0; i < c.Layers; i++ {
		if err := cl.Unregister(ctx, c.Region(i)); err != nil {
			return err
		}
	}
	return nil
}

// Fill writes pseudo-random bytes (deterministic per seed) everywhere.
func (c *Cache) Fill(seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := c.mem.Bytes()
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		b[i], b[i+1], b[i+2], b[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
}

// Poison sets every byte to v.
func (c *Cache) Poison(v byte) {
	b := c.mem.Bytes()
	for i := range b {
		b[i] = v
	}
}

// Move is one block: layer, source offset and destination offset.
type Move struct {
	Layer          int
	SrcOff, DstOff uint64
	Len            uint64
}

// Ranges moves each layer whole in ranges of rangeBytes, same offsets.
func Ranges(c *Cache, rangeBytes uint64) []Move {
	var ms []Move
	for l := 0; l < c.Layers; l++ {
		for off := uint64(0); off < c.LayerBytes; off += rangeBytes {
			ms = append(ms, Move{Layer: l, SrcOff: off, DstOff: off, Len: min(rangeBytes, c.LayerBytes-off)})
		}
	}
	return ms
}

// Blocks moves every block of every layer to a random block of the same
// layer (a permutation), in random order: what a paged KV cache's block
// table looks like after a while.
func Blocks(c *Cache, block uint64, seed uint64) []Move {
	r := rand.New(rand.NewPCG(seed, 7))
	n := int(c.LayerBytes / block)
	var ms []Move
	for l := 0; l < c.Layers; l++ {
		perm := r.Perm(n)
		for i := 0; i < n; i++ {
			ms = append(ms, Move{Layer: l, SrcOff: uint64(i) * block, DstOff: uint64(perm[i]) * block, Len: block})
		}
	}
	r.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
	return ms
}

// ByLayer splits moves per layer, keeping their order.
func ByLayer(c *Cache, ms []Move) [][]Move {
	out := make([][]Move, c.Layers)
	for _, m := range ms {
		out[m.Layer] = append(out[m.Layer], m)
	}
	return out
}

// Transfer builds a transfer of moves from local cache src to remote cache
// dst (names only: dst may live at the peer). For a pull, the moves still
// say src -> dst, and src is the remote side.
func Transfer(route string, dir wire.Direction, tag string, local, remote *Cache, ms []Move) client.Transfer {
	t := client.Transfer{Route: route, Dir: dir, Tag: tag, LocalNames: local.Regions(), RemoteNames: remote.Regions()}
	t.Ops = make([]wire.LocalOp, len(ms))
	for i, m := range ms {
		op := wire.LocalOp{Local: uint32(m.Layer), Remote: uint32(m.Layer), Len: m.Len}
		if dir == wire.Push {
			op.LocalOff, op.RemoteOff = m.SrcOff, m.DstOff
		} else {
			op.RemoteOff, op.LocalOff = m.SrcOff, m.DstOff
		}
		t.Ops[i] = op
	}
	return t
}

// Verify checks that every move's destination bytes equal its source bytes,
// and that dst's guard bytes still hold guard.
func Verify(src, dst *Cache, ms []Move, guard byte) error {
	for i, m := range ms {
		s := src.Layer(m.Layer)[m.SrcOff : m.SrcOff+m.Len]
		d := dst.Layer(m.Layer)[m.DstOff : m.DstOff+m.Len]
		if !bytes.Equal(s, d) {
			at := 0
			for at < len(s) && s[at] == d[at] {
				at++
			}
			return fmt.Errorf("kvsim: move %d (layer %d, %d B from %d to %d): first difference at byte %d: got %#02x, want %#02x",
				i, m.Layer, m.Len, m.SrcOff, m.DstOff, at, d[at], s[at])
		}
	}
	all := dst.All()
	for i := uint64(0); i < dst.Guard; i++ {
		if all[i] != guard || all[uint64(len(all))-1-i] != guard {
			return fmt.Errorf("kvsim: %s: guard bytes around the regions were overwritten", dst.Name)
		}
	}
	return nil
}

// Bytes adds up the moves' lengths.
func Bytes(ms []Move) uint64 {
	var n uint64
	for _, m := range ms {
		n += m.Len
	}
	return n
}
