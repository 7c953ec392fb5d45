// Package kvsim is a synthetic paged KV cache for the demo, benchmarks and
// tests: an engine-side allocation (a memfd, the hostmem backend's "device
// memory", or CUDA device memory shared by IPC handle), cut into per-layer
// regions that sit at a non-zero offset inside it, with builders for range
// and scattered-block transfers and byte-exact verification.
//
// It plays the engine's part only; it never talks to peers.
package kvsim

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/wire"
)

// Cache is Layers regions of LayerBytes each, laid out after Guard bytes
// inside one engine allocation (with Guard bytes after them too, so a
// write past a region shows).
type Cache struct {
	Name       string
	Layers     int
	LayerBytes uint64
	Guard      uint64
	mem        Memory

	// Buffers kept between Verify and Poison calls, so a bench that checks
	// after every transfer does not allocate a layer's worth each time
	// (its garbage collections then showed up in the transfers' p99).
	// Taken and put back whole: safe from several goroutines.
	scratch atomic.Pointer[[]byte]
	fill    atomic.Pointer[fillBuf]
}

// fillBuf is a buffer of one repeated byte, for Poison.
type fillBuf struct {
	v byte
	b []byte
}

// takeScratch returns a buffer of n bytes, the kept one when it is large
// enough; putScratch keeps it for the next call.
func (c *Cache) takeScratch(n uint64) []byte {
	if p := c.scratch.Swap(nil); p != nil && uint64(cap(*p)) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

func (c *Cache) putScratch(b []byte) { c.scratch.Store(&b) }

// New allocates a cache in shared host memory (the hostmem backend's
// device memory).
func New(name string, layers int, layerBytes, guard uint64) (*Cache, error) {
	if layers <= 0 || layerBytes == 0 {
		return nil, fmt.Errorf("kvsim: %d layers of %d B", layers, layerBytes)
	}
	m, err := NewHostMemory(name, 2*guard+uint64(layers)*layerBytes)
	if err != nil {
		return nil, err
	}
	return NewOn(m, name, layers, layerBytes, guard)
}

// NewOn lays a cache out in mem, which it then owns (Close frees it).
func NewOn(mem Memory, name string, layers int, layerBytes, guard uint64) (*Cache, error) {
	if layers <= 0 || layerBytes == 0 {
		return nil, fmt.Errorf("kvsim: %d layers of %d B", layers, layerBytes)
	}
	if need := 2*guard + uint64(layers)*layerBytes; mem.Size() < need {
		return nil, fmt.Errorf("kvsim: %s: %d B of memory for %d B", name, mem.Size(), need)
	}
	return &Cache{Name: name, Layers: layers, LayerBytes: layerBytes, Guard: guard, mem: mem}, nil
}

// Close frees the memory (the sidecar keeps its own mapping until it
// unregisters).
func (c *Cache) Close() error { return c.mem.Close() }

// Memory returns the allocation behind the cache.
func (c *Cache) Memory() Memory { return c.mem }

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

func (c *Cache) layerOff(i int) uint64 { return c.Guard + uint64(i)*c.LayerBytes }

// ReadLayer copies layer i out.
func (c *Cache) ReadLayer(i int) ([]byte, error) {
	b := make([]byte, c.LayerBytes)
	return b, c.readLayerInto(i, b)
}

// readLayerInto is ReadLayer into b (LayerBytes long).
func (c *Cache) readLayerInto(i int, b []byte) error { return c.mem.ReadAt(b, c.layerOff(i)) }

// Snapshot copies the whole allocation out, guards included.
func (c *Cache) Snapshot() ([]byte, error) {
	b := make([]byte, 2*c.Guard+uint64(c.Layers)*c.LayerBytes)
	return b, c.mem.ReadAt(b, 0)
}

// Register registers every layer with the sidecar behind cl.
func (c *Cache) Register(ctx context.Context, cl *client.Client, access wire.Access) error {
	for i := 0; i < c.Layers; i++ {
		if err := cl.Register(ctx, c.mem.Region(c.Region(i), c.layerOff(i), c.LayerBytes, access)); err != nil {
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

// fillChunk is how much Fill and Poison write at a time.
const fillChunk = 8 << 20

// Fill writes pseudo-random bytes (deterministic per seed) everywhere.
func (c *Cache) Fill(seed uint64) error {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	buf := make([]byte, fillChunk)
	size := 2*c.Guard + uint64(c.Layers)*c.LayerBytes
	for off := uint64(0); off < size; off += fillChunk {
		b := buf[:min(fillChunk, size-off)]
		for i := 0; i+8 <= len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], r.Uint64())
		}
		if err := c.mem.WriteAt(b, off); err != nil {
			return err
		}
	}
	return nil
}

// Poison sets every byte to v.
func (c *Cache) Poison(v byte) error {
	size := 2*c.Guard + uint64(c.Layers)*c.LayerBytes
	f := c.fill.Load()
	if f == nil || f.v != v || uint64(len(f.b)) < min(fillChunk, size) {
		f = &fillBuf{v: v, b: bytes.Repeat([]byte{v}, int(min(fillChunk, size)))}
		c.fill.Store(f)
	}
	buf := f.b
	for off := uint64(0); off < size; off += fillChunk {
		if err := c.mem.WriteAt(buf[:min(fillChunk, size-off)], off); err != nil {
			return err
		}
	}
	return nil
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
	// With one cache both sides, s holds its kept buffer and d is a new
	// one (takeScratch finds none); whichever goes back last is kept.
	s := src.takeScratch(src.LayerBytes)
	defer src.putScratch(s)
	d := dst.takeScratch(max(dst.LayerBytes, dst.Guard))
	defer dst.putScratch(d)
	for _, layer := range layersOf(ms) {
		if err := src.readLayerInto(layer, s); err != nil {
			return err
		}
		if err := dst.readLayerInto(layer, d[:dst.LayerBytes]); err != nil {
			return err
		}
		for i, m := range ms {
			if m.Layer != layer {
				continue
			}
			a, b := s[m.SrcOff:m.SrcOff+m.Len], d[m.DstOff:m.DstOff+m.Len]
			if !bytes.Equal(a, b) {
				at := 0
				for at < len(a) && a[at] == b[at] {
					at++
				}
				return fmt.Errorf("kvsim: move %d (layer %d, %d B from %d to %d): first difference at byte %d: got %#02x, want %#02x",
					i, m.Layer, m.Len, m.SrcOff, m.DstOff, at, b[at], a[at])
			}
		}
	}
	g := d[:dst.Guard]
	for _, off := range []uint64{0, dst.Guard + uint64(dst.Layers)*dst.LayerBytes} {
		if err := dst.mem.ReadAt(g, off); err != nil {
			return err
		}
		for _, v := range g {
			if v != guard {
				return fmt.Errorf("kvsim: %s: guard bytes around the regions were overwritten", dst.Name)
			}
		}
	}
	return nil
}

func layersOf(ms []Move) []int {
	seen := map[int]bool{}
	var ls []int
	for _, m := range ms {
		if !seen[m.Layer] {
			seen[m.Layer] = true
			ls = append(ls, m.Layer)
		}
	}
	return ls
}

// Bytes adds up the moves' lengths.
func Bytes(ms []Move) uint64 {
	var n uint64
	for _, m := range ms {
		n += m.Len
	}
	return n
}

// RunLayers submits one transfer per layer that ms touches, all at once
// (tagged TAG-LAYER, on route), as an engine pushing layer after layer
// keeps them in flight, then waits for each: up to timeout (0: as long as
// ctx allows) and until it is done. It returns how many it submitted.
func RunLayers(ctx context.Context, cl *client.Client, route string, dir wire.Direction, tag string, local, remote *Cache, ms []Move,
	timeout time.Duration) (int, error) {
	var ids []uint64
	for l, lm := range ByLayer(local, ms) {
		if len(lm) == 0 {
			continue
		}
		id, err := cl.Submit(ctx, Transfer(route, dir, fmt.Sprintf("%s-%d", tag, l), local, remote, lm))
		if err != nil {
			return len(ids), fmt.Errorf("kvsim: submit layer %d of %s: %w", l, tag, err)
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		st, err := cl.Wait(ctx, id, timeout)
		if err != nil {
			return len(ids), fmt.Errorf("kvsim: transfer %d of %s: %w", id, tag, err)
		}
		if st.State != wire.StateDone {
			return len(ids), fmt.Errorf("kvsim: transfer %d of %s: state %s after %v, want done", id, tag, st.State, timeout)
		}
	}
	return len(ids), nil
}
