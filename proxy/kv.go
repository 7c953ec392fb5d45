// KV caches: layouts registered over regions, and the engine's KV
// transfers (docs/KVLAYOUT.md). A KV transfer moves rows, not bytes: each
// side maps the transfer's canonical byte stream to its own layout
// (kvlayout.Side), so the chunks on the wire carry their canonical offset
// (wire.KVRegion) and the sender never learns the receiver's strides.

package proxy

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/proxy/grant"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// kvInfoTimeout bounds the wait for a peer's KVInfo answer.
const kvInfoTimeout = 5 * time.Second

// kvCache is a KV cache an engine registered: one layout for every layer,
// and per layer the regions that hold its tensors.
type kvCache struct {
	name   string
	owner  region.Owner // who registered it; its regions are its group's
	layout kvlayout.Layout
	layers [][]string
	shape  wire.KVShape
	grants *grant.Set // under kvTable.mu (kvgrant.go)
	uses   uses       // peer transfers admitted under each key, until they let go (kvfence.go; under kvTable.mu)
}

// kvTable holds the KV caches of this sidecar and what it learned of its
// peers' (their shapes, per session): registering a cache, asking a peer
// for its cache's shape and answering such questions, and building one
// side of a KV transfer over the regions a cache names (admitting a
// peer's request included).
type kvTable struct {
	regions       *region.Table
	devKind       device.Kind
	newID         func() uint64 // KVInfo request numbers, never 0
	requireGrants bool          // security.require_grants: every cache guarded

	mu     sync.Mutex
	caches map[string]*kvCache
	peers  map[kvPeerKey]wire.KVShape
	waits  map[uint64]chan *wire.KVInfo
	// granted is closed at each grant (and made anew): pushes waiting
	// for theirs look again (kvpark.go).
	granted chan struct{}
	// registered is closed at each registration (and made anew): peers'
	// questions about a cache not registered yet look again (kvpark.go).
	registered chan struct{}
}

type kvPeerKey struct {
	session uint64
	name    string
}

func (t *kvTable) init(regions *region.Table, devKind device.Kind, newID func() uint64, requireGrants bool) {
	t.regions, t.devKind, t.newID, t.requireGrants = regions, devKind, newID, requireGrants
	t.caches = map[string]*kvCache{}
	t.peers = map[kvPeerKey]wire.KVShape{}
	t.granted = make(chan struct{})
	t.registered = make(chan struct{})
	t.waits = map[uint64]chan *wire.KVInfo{}
}

func (t *kvTable) get(name string) *kvCache {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.caches[name]
}

// forgetSession drops what was learned over a session that closed.
func (t *kvTable) forgetSession(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.peers {
		if k.session == id {
			delete(t.peers, k)
		}
	}
}

// forgetPeer drops one cached peer shape (a transfer against it failed:
// the peer may have registered its cache anew).
func (t *kvTable) forgetPeer(session uint64, name string) {
	t.mu.Lock()
	delete(t.peers, kvPeerKey{session, name})
	t.mu.Unlock()
}

// layoutFromWire converts a registered layout; kvlayout validates it.
func layoutFromWire(w *wire.KVLayout) kvlayout.Layout {
	l := kvlayout.Layout{DType: kvlayout.DType(w.DType), BlockSize: w.BlockSize, Blocks: w.Blocks,
		Heads: w.Heads, HeadLo: w.HeadLo, HeadHi: w.HeadHi, Parts: make([]kvlayout.Part, len(w.Parts))}
	for i, p := range w.Parts {
		l.Parts[i] = kvlayout.Part{Name: p.Name, Width: p.Width, Tensor: int(p.Tensor), Offset: p.Offset,
			BlockStride: p.BlockStride, SlotStride: p.SlotStride, HeadStride: p.HeadStride}
	}
	return l
}

// shapeOf is what a peer learns of layout l.
func shapeOf(l *kvlayout.Layout) wire.KVShape {
	s := wire.KVShape{DType: uint8(l.DType), BlockSize: l.BlockSize, Blocks: l.Blocks, Heads: l.Heads,
		HeadLo: l.HeadLo, HeadHi: l.HeadHi, Widths: make([]uint32, len(l.Parts))}
	for i := range l.Parts {
		s.Widths[i] = l.Parts[i].Width
	}
	if l.HeadOuter() {
		s.Flags |= wire.KVHeadOuter
	}
	return s
}

// kvOrder is the canonical order of a transfer between layout here and a
// peer of shape peer, starting at token firstHere of our table and
// firstPeer of the peer's: block-major when both keep a head's tokens
// together and cut the tokens into the same blocks, else token-major.
// Both sides compute it; the peer checks the requester's.
func kvOrder(here *kvlayout.Layout, peer *wire.KVShape, firstHere, firstPeer uint32) kvlayout.Order {
	bs := here.BlockSize
	if here.HeadOuter() && peer.Flags&wire.KVHeadOuter != 0 && peer.BlockSize == bs && bs > 0 && firstHere%bs == firstPeer%bs {
		return kvlayout.BlockMajor
	}
	return kvlayout.TokenMajor
}

// layoutOfShape is a peer's layout as far as its shape tells: enough for
// kvlayout.Check and kvlayout.Columns, which read no offsets or strides.
func layoutOfShape(s *wire.KVShape) kvlayout.Layout {
	l := kvlayout.Layout{DType: kvlayout.DType(s.DType), BlockSize: s.BlockSize, Blocks: s.Blocks, Heads: s.Heads,
		HeadLo: s.HeadLo, HeadHi: s.HeadHi, Parts: make([]kvlayout.Part, len(s.Widths))}
	for i, w := range s.Widths {
		l.Parts[i].Width = w
	}
	return l
}

func sameShape(a, b *wire.KVShape) bool {
	if a.DType != b.DType || a.BlockSize != b.BlockSize || a.Blocks != b.Blocks || a.Heads != b.Heads ||
		a.HeadLo != b.HeadLo || a.HeadHi != b.HeadHi || len(a.Widths) != len(b.Widths) || a.Flags != b.Flags {
		return false
	}
	for i := range a.Widths {
		if a.Widths[i] != b.Widths[i] {
			return false
		}
	}
	return true
}

// register gives a layout to regions the engine registered. Every
// layer's regions must exist and hold the layout (checked again whenever a
// transfer uses them: a region may be registered anew meanwhile). A name
// registered again is replaced; reshaped says it had another shape, which
// peers that cached it must forget (engineHost.RegisterKV tells them).
func (t *kvTable) register(o region.Owner, m *wire.RegisterKV) (reshaped bool, err error) {
	if m.Name == "" {
		return false, codeErr(wire.CodeBadRequest, "KV cache needs a name")
	}
	l := layoutFromWire(&m.Layout)
	if len(m.Layers) == 0 {
		return false, codeErr(wire.CodeBadRequest, "KV cache %q has no layers", m.Name)
	}
	for i, names := range m.Layers {
		rs, err := t.regionsOf(&l, o.Group, names, 0)
		if err != nil {
			return false, codeErr(errCode(err), "KV cache %q layer %d: %w", m.Name, i, err)
		}
		region.ReleaseAll(rs)
	}
	// Parts that continue each other (packed K|V) move as one column.
	l = l.Merged()
	if k := t.devKind; (k == device.KindACL || k == device.KindHIP) && !l.HeadsTogether() {
		return false, codeErr(wire.CodeUnsupported, "KV cache %q: the %s backend moves KV rows with plain copies, and this layout keeps a token's heads apart (HND-like: head stride %d B, row %d B); register a layout with a token's heads together (NHD, as vllm-ascend's), and let a CUDA peer convert",
			m.Name, k, l.Parts[0].HeadStride, uint64(l.Parts[0].Width)*l.DType.Size())
	}
	c := &kvCache{name: m.Name, owner: o, layout: l, layers: m.Layers, shape: shapeOf(&l)}
	t.mu.Lock()
	old := t.caches[m.Name]
	if old != nil && old.owner.Group != o.Group {
		t.mu.Unlock()
		return false, codeErr(wire.CodeExists, "KV cache %q is registered by another engine connection; choose another name, or wait until its owner closes its connection", m.Name)
	}
	c.grants, c.uses = t.newGrants(), uses{}
	if old != nil {
		c.grants, c.uses = old.grants, old.uses // registered anew by its group: the grants and their uses stay
	}
	t.caches[m.Name] = c
	close(t.registered)
	t.registered = make(chan struct{})
	guarded := c.grants.Guarded()
	t.mu.Unlock()
	if guarded {
		t.guardRegions(c)
	}
	return old != nil && !sameShape(&old.shape, &c.shape), nil
}

// regionsOf acquires one layer's regions, which must be group's, with
// rights want and checks the layout against their lengths.
func (t *kvTable) regionsOf(l *kvlayout.Layout, group string, names []string, want wire.Access) ([]*region.Region, error) {
	if n := l.NumTensors(); len(names) != n {
		return nil, codeErr(wire.CodeBadRequest, "%d regions for a layout of %d tensors", len(names), n)
	}
	rs, err := t.regions.AcquireOwn(group, names, want)
	if err != nil {
		return nil, err
	}
	lens := make([]uint64, len(rs))
	for i, r := range rs {
		lens[i] = r.Len
	}
	if err := l.Validate(lens); err != nil {
		region.ReleaseAll(rs)
		return nil, codeErr(wire.CodeOutOfRange, "%w", err)
	}
	return rs, nil
}

// side acquires the regions of the listed layers of cache c (rights
// want) and builds the side of a transfer over them; a side we write (a
// pull's destination, a peer's push) must name each block once. On
// success the caller owns the regions' references.
func (t *kvTable) side(c *kvCache, layers []uint32, want wire.Access, table []uint32, first, tokens, headLo, headHi uint32, cols []kvlayout.Col, order kvlayout.Order) (*kvlayout.Side, []*region.Region, error) {
	if len(layers) == 0 {
		return nil, nil, codeErr(wire.CodeBadRequest, "KV transfer names no layer")
	}
	var regions []*region.Region
	idx := make([][]int, len(layers))
	for i, layer := range layers {
		if int(layer) >= len(c.layers) {
			region.ReleaseAll(regions)
			return nil, nil, codeErr(wire.CodeOutOfRange, "KV cache %q has %d layers; the transfer names layer %d", c.name, len(c.layers), layer)
		}
		rs, err := t.regionsOf(&c.layout, c.owner.Group, c.layers[layer], want)
		if err != nil {
			region.ReleaseAll(regions)
			return nil, nil, codeErr(errCode(err), "KV cache %q layer %d: %w", c.name, layer, err)
		}
		idx[i] = make([]int, len(rs))
		for t := range rs {
			idx[i][t] = len(regions) + t
		}
		regions = append(regions, rs...)
	}
	side, err := kvlayout.NewSide(kvlayout.SideSpec{Layout: c.layout, Regions: idx, Table: table,
		FirstToken: uint64(first), Tokens: uint64(tokens), HeadLo: headLo, HeadHi: headHi, Cols: cols, Order: order,
		Written: want&(wire.AccessLocalWrite|wire.AccessRemoteWrite) != 0})
	if err != nil {
		region.ReleaseAll(regions)
		code := wire.CodeOutOfRange
		if errors.Is(err, kvlayout.ErrRepeatedBlock) {
			code = wire.CodeBadRequest
		}
		return nil, nil, codeErr(code, "KV cache %q: %w", c.name, err)
	}
	return side, regions, nil
}

// kvSegs appends the device segments of canonical bytes [off, off+n) of
// side, whose region indices index regions.
func kvSegs(side *kvlayout.Side, regions []*region.Region, off uint64, n uint32, segs []device.Seg) []device.Seg {
	side.Segments(off, uint64(n), func(_, ri int, toff uint64, length uint32, _ uint64) {
		segs = append(segs, device.Seg{Addr: regions[ri].Addr(toff), Len: uint64(length)})
	})
	return segs
}

// kvRuns appends the strided device runs of canonical bytes [off, off+n)
// of side: one per block run where a layout keeps heads apart (HND), so a
// strided kernel gets them without a walk over every row.
func kvRuns(side *kvlayout.Side, regions []*region.Region, off uint64, n uint32, runs []device.Run) []device.Run {
	side.Runs(off, uint64(n), func(_, ri int, toff uint64, piece, n1 uint32, s1 uint64, n2 uint32, s2 uint64, _ uint64) {
		runs = append(runs, device.Run{Addr: regions[ri].Addr(toff), Len: piece, N1: n1, S1: s1, N2: n2, S2: s2})
	})
	return runs
}

// kvPlan is the chunk plan of a KV transfer whose source is side: its
// chunks map to runs (gathered with Copier.GatherRuns) and to segments.
func kvPlan(side *kvlayout.Side, regions []*region.Region, chunk int) (*staging.Plan, error) {
	p, err := staging.NewMappedRunPlan(side.Len(), chunk, wire.KVRegion, func(off uint64, n uint32, segs []device.Seg) []device.Seg {
		return kvSegs(side, regions, off, n, segs)
	}, func(off uint64, n uint32, runs []device.Run) []device.Run {
		return kvRuns(side, regions, off, n, runs)
	})
	if err != nil {
		return nil, codeErr(wire.CodeBadRequest, "%w", err)
	}
	return p, nil
}

// checkKV refuses a transfer between layouts here and peer before anything
// moves, and returns its head range and columns: the heads asked for (both
// 0: every head both sides hold) must lie in both slices.
func checkKV(here, peer *kvlayout.Layout, headLo, headHi uint32) (uint32, uint32, []kvlayout.Col, error) {
	if err := kvlayout.Check(*here, *peer); err != nil {
		return 0, 0, nil, codeErr(wire.CodeBadRequest, "%w", err)
	}
	lo, hi := kvlayout.Overlap(*here, *peer)
	if headLo == 0 && headHi == 0 {
		headLo, headHi = lo, hi
	}
	if headLo >= headHi || headLo < lo || headHi > hi {
		return 0, 0, nil, codeErr(wire.CodeBadRequest, "kv heads [%d, %d) asked for; here [%d, %d), at the peer [%d, %d)",
			headLo, headHi, here.HeadLo, here.HeadHi, peer.HeadLo, peer.HeadHi)
	}
	return headLo, headHi, kvlayout.Columns(*here, *peer), nil
}

// checkPeerTable checks the peer's block table against its shape, and,
// when the peer is the destination (written), that it names each block
// the tokens use once, before anything is sent: the peer checks it again,
// but an engine's mistake is clearer refused here, naming the request.
func checkPeerTable(p *wire.KVShape, table []uint32, first, tokens uint32, written bool) error {
	if p.BlockSize == 0 || uint64(first)+uint64(tokens) > uint64(len(table))*uint64(p.BlockSize) {
		return codeErr(wire.CodeOutOfRange, "the peer's block table holds %d blocks of %d tokens; the transfer needs tokens [%d, %d)",
			len(table), p.BlockSize, first, uint64(first)+uint64(tokens))
	}
	for i, b := range table {
		if b >= p.Blocks {
			return codeErr(wire.CodeOutOfRange, "the peer's block table entry %d is block %d; its cache has %d blocks", i, b, p.Blocks)
		}
	}
	if written {
		if err := kvlayout.CheckDistinct(table, p.BlockSize, uint64(first), uint64(tokens)); err != nil {
			return codeErr(wire.CodeBadRequest, "the peer's block table: %w", err)
		}
	}
	return nil
}

// peerShape returns the shape of the peer's KV cache name: cached per
// session, else asked for (one round trip, at most kvInfoTimeout).
func (t *kvTable) peerShape(ctx context.Context, ss *session, name string) (wire.KVShape, error) {
	key := kvPeerKey{ss.id, name}
	t.mu.Lock()
	if sh, ok := t.peers[key]; ok {
		t.mu.Unlock()
		return sh, nil
	}
	seq := t.newID()
	ch := make(chan *wire.KVInfo, 1)
	t.waits[seq] = ch
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.waits, seq)
		t.mu.Unlock()
	}()
	ss.send(&wire.KVInfoRequest{Seq: seq, Name: name})
	timer := time.NewTimer(kvInfoTimeout)
	defer timer.Stop()
	select {
	case info := <-ch:
		if !info.Found {
			return wire.KVShape{}, codeErr(wire.CodeUnknownRegion, "peer %s has no KV cache %q", ss.peerName, name)
		}
		t.mu.Lock()
		t.peers[key] = info.Shape
		t.mu.Unlock()
		return info.Shape, nil
	case <-ss.done:
		return wire.KVShape{}, codeErr(wire.CodePeerUnavailable, "session with %s closed", ss.peerName)
	case <-ctx.Done():
		return wire.KVShape{}, codeErr(wire.CodeShutdown, "sidecar is shutting down")
	case <-timer.C:
		return wire.KVShape{}, codeErr(wire.CodeTimeout, "peer %s did not describe its KV cache %q within %v", ss.peerName, name, kvInfoTimeout)
	}
}

// regSignal is closed at the next registration of a KV cache.
func (t *kvTable) regSignal() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.registered
}

// infoAsked answers a peer's KVInfoRequest.
func (t *kvTable) infoAsked(ss *session, m *wire.KVInfoRequest) {
	info := &wire.KVInfo{Seq: m.Seq, Name: m.Name}
	if c := t.get(m.Name); c != nil {
		info.Found, info.Layers, info.Shape = true, uint32(len(c.layers)), c.shape
	}
	ss.send(info)
}

// infoAnswered hands a KVInfo to the request waiting for it; an unasked
// one (Seq 0) says the peer registered that cache anew.
func (t *kvTable) infoAnswered(ss *session, m *wire.KVInfo) {
	if m.Seq == 0 {
		t.forgetPeer(ss.id, m.Name)
		return
	}
	t.mu.Lock()
	ch := t.waits[m.Seq]
	delete(t.waits, m.Seq)
	t.mu.Unlock()
	if ch != nil {
		ch <- m
	}
}

// admit checks a peer's KV request against our cache m.Name: its shape
// unchanged since the peer asked, the layouts compatible, the layers,
// block table, tokens and heads inside ours, and the total the peer
// computed equal to ours, and a live grant covering its blocks when the
// cache is guarded (kvgrant.go). It returns our side and its regions (acquired
// with rights want).
func (t *kvTable) admit(ss *session, m *wire.KVRequest, want wire.Access) (*kvSide, error) {
	if ss.ours(m.Transfer) {
		return nil, codeErr(wire.CodeMalformed, "transfer id %d has our parity", m.Transfer)
	}
	c := t.get(m.Name)
	if c == nil {
		return nil, codeErr(wire.CodeUnknownRegion, "no KV cache %q here", m.Name)
	}
	if !sameShape(&c.shape, &m.PeerShape) {
		return nil, codeErr(wire.CodeBadRequest, "KV cache %q was registered anew since the peer asked for its shape; retry", m.Name)
	}
	peer := layoutOfShape(&m.Shape)
	lo, hi, cols, err := checkKV(&c.layout, &peer, m.HeadLo, m.HeadHi)
	if err != nil {
		return nil, err
	}
	if lo != m.HeadLo || hi != m.HeadHi {
		return nil, codeErr(wire.CodeMalformed, "KV request names heads [%d, %d)", m.HeadLo, m.HeadHi)
	}
	// The requester's first token is not in the request; the order it
	// chose must be one our side can use: block-major needs both sides
	// head-outer and of one block size (the alignment of first tokens
	// the requester checked; a wrong claim moves rows within the blocks
	// we granted, never outside them).
	order := kvlayout.Order(m.Order)
	if order == kvlayout.BlockMajor && kvOrder(&c.layout, &m.Shape, 0, 0) != kvlayout.BlockMajor {
		return nil, codeErr(wire.CodeMalformed, "KV request asks for block-major order, which needs both sides head-outer with one block size: here %v and %d, there %v and %d",
			c.layout.HeadOuter(), c.layout.BlockSize, m.Shape.Flags&wire.KVHeadOuter != 0, m.Shape.BlockSize)
	}
	side, regions, err := t.side(c, m.Layers, want, m.Blocks, m.First, m.Tokens, lo, hi, cols, order)
	if err != nil {
		return nil, err
	}
	if side.Len() != m.Total {
		region.ReleaseAll(regions)
		return nil, codeErr(wire.CodeMalformed, "KV request says %d B; its rows make %d B here", m.Total, side.Len())
	}
	// Last: a request refused for another reason keeps its grant's use.
	use, err := t.useGrant(c, m, want == wire.AccessRemoteWrite, time.Now())
	if err != nil {
		region.ReleaseAll(regions)
		return nil, err
	}
	return &kvSide{side: side, regions: regions, use: use}, nil
}

// kvSide is one side of a KV transfer here: its mapping, the regions it
// holds references to (indexed by the mapping's region indices), and the
// use of the transfer key it was admitted under (nil: none), which the
// transfer ends once it let go of the regions.
type kvSide struct {
	side    *kvlayout.Side
	regions []*region.Region
	use     *grantUse
}

// kvNote is what a subscriber's Notify says of a KV transfer that landed
// here (a peer's push) or was served from here (a peer's pull).
type kvNote struct {
	name          string
	layers        []uint32
	first, tokens uint32
}

func newKVNote(m *wire.KVRequest) *kvNote {
	return &kvNote{name: m.Name, layers: m.Layers, first: m.First, tokens: m.Tokens}
}

// fill adds the KV fields to n; nothing for a byte transfer (k nil).
func (k *kvNote) fill(n *wire.Notify) {
	if k != nil {
		n.KV, n.Layers, n.First, n.Tokens = k.name, k.layers, k.first, k.tokens
	}
}
