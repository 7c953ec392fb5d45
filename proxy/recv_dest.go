package proxy

import (
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// Where an incoming transfer's chunks land, by kind: byte ranges of
// regions (a push's Announce, our pull's ops), or a KV cache's rows
// (kv.go), whose chunks name a canonical offset that this side maps
// through its own layout. The receive core decides whether a chunk lands;
// its destination says where and checks that it fits.

// inDest is the kind of an incoming transfer's destination.
type inDest interface {
	// check refuses a chunk whose segments do not fit (the core checks
	// its index and count) and notes in l where a byte chunk lands.
	check(ch *wire.Chunk, l *landing) error
	// segs appends the device ranges of a checked chunk, in payload order
	// (the synchronous paths: inline and ring).
	segs(ch *wire.Chunk, l *landing, segs []device.Seg) []device.Seg
	// scatter enqueues the copy of a checked chunk's payload from buf to
	// the device on cp; done runs when it completed.
	scatter(cp *staging.Copier, ch *wire.Chunk, l *landing, buf device.Pinned, done func(error)) error
}

// landing is a reader's reused buffers for where its chunk goes.
type landing struct {
	segs []device.Seg // a byte chunk's, from check
	runs []device.Run // a KV chunk's, from scatter
	sync []device.Seg // for a synchronous scatter, from segs
}

// byteDest: chunk segments name a region of the transfer's list and an
// offset in it. It points at the list (inXfer.regions), so that it sits
// in the interface without an allocation of its own.
type byteDest struct{ list *[]*region.Region }

// bytesInto is the destination of x's byte chunks: its regions.
func bytesInto(x *inXfer) byteDest { return byteDest{&x.regions} }

func (d byteDest) regions() []*region.Region {
	if d.list == nil {
		return nil
	}
	return *d.list
}

func (d byteDest) check(ch *wire.Chunk, l *landing) error {
	regions := d.regions()
	l.segs = l.segs[:0]
	for i, cs := range ch.Segs {
		if int(cs.Region) >= len(regions) {
			return codeErr(wire.CodeUnknownRegion, "chunk %d segment %d names region #%d; the transfer has %d", ch.Index, i, cs.Region, len(regions))
		}
		s, err := regions[cs.Region].Seg(cs.Offset, uint64(cs.Len))
		if err != nil {
			return codeErr(wire.CodeOutOfRange, "chunk %d segment %d: %w", ch.Index, i, err)
		}
		l.segs = append(l.segs, s)
	}
	return nil
}

func (d byteDest) segs(_ *wire.Chunk, l *landing, segs []device.Seg) []device.Seg {
	return append(segs, l.segs...)
}

func (d byteDest) scatter(cp *staging.Copier, _ *wire.Chunk, l *landing, buf device.Pinned, done func(error)) error {
	return cp.Scatter(l.segs, buf, done)
}

// kvDest: a KV chunk's one segment is its place in the canonical stream
// of total bytes; the side says where its rows go here. Mapping is left
// to segs and scatter, outside any lock: the streams of one transfer map
// their chunks at once (the side is read-only; the chunk's hold keeps its
// regions).
type kvDest struct {
	side    *kvlayout.Side
	regions []*region.Region
	total   uint64
}

func (d kvDest) check(ch *wire.Chunk, _ *landing) error {
	if len(ch.Segs) != 1 || ch.Segs[0].Region != wire.KVRegion || !region.InRange(ch.Segs[0].Offset, uint64(ch.Segs[0].Len), d.total) {
		return codeErr(wire.CodeMalformed, "chunk %d of a KV transfer of %d B must name one canonical range inside it", ch.Index, d.total)
	}
	return nil
}

func (d kvDest) segs(ch *wire.Chunk, _ *landing, segs []device.Seg) []device.Seg {
	return kvSegs(d.side, d.regions, ch.Segs[0].Offset, ch.Segs[0].Len, segs)
}

// scatter maps the chunk to strided runs, one per block run where the
// layout keeps heads apart, for Copier.ScatterRuns.
func (d kvDest) scatter(cp *staging.Copier, ch *wire.Chunk, l *landing, buf device.Pinned, done func(error)) error {
	l.runs = kvRuns(d.side, d.regions, ch.Segs[0].Offset, ch.Segs[0].Len, l.runs[:0])
	return cp.ScatterRuns(l.runs, buf, done)
}
