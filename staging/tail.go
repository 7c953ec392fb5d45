package staging

// The end of a transfer cut finer. A plan's chunks are all one slot long
// but the last; spread over a session's streams, the last round of them
// leaves each stream a whole chunk to write at the end, and the stream
// that got its last chunk latest ends alone while the others idle
// (docs/BENCHMARKS.md, "The one-transfer rows, traced": 1.9-3.6 ms of a
// 45 ms transfer on eight H200 streams). SplitTail cuts the last rounds
// smaller, halving round by round down to a smallest chunk, so that the
// stream chosen for each of the last chunks (the least loaded one,
// dispatch.go) is late by at most that smallest chunk. Only the chunk
// lengths change: each chunk still names where its bytes land, which is
// all a receiver reads (PROTOCOL.md, section 7: chunks of any length up
// to the receiver's slot, in any order).

// tailSizes is the pure planner: the payload lengths, in order, of the
// chunks that end a transfer of total bytes otherwise cut into chunks of
// cs, for streams data streams, no chunk below minChunk bytes but the
// first of the tail (what is left in front of the even rounds). The bytes
// before the tail are a whole number of chunks of cs. From the end: a
// round of streams chunks of minChunk, before it one of 2 x minChunk, and
// so on while a round of the next size fits in what is left of the last
// streams x cs bytes; what is left goes first, in equal chunks of at most
// the size reached. nil when nothing would change: one stream, or no halving
// possible (minChunk 0 or above cs/2).
func tailSizes(total, cs uint64, streams int, minChunk uint64) []uint32 {
	if streams < 2 || minChunk == 0 || cs == 0 || minChunk > cs/2 || total == 0 {
		return nil
	}
	span := uint64(streams) * cs
	if span/uint64(streams) != cs {
		return nil // overflow: no transfer is that long anyway
	}
	var head uint64
	if total > span {
		head = (total - span) / cs * cs
	}
	rest := total - head
	// Rounds from the end, smallest first.
	var rounds []uint64
	size := minChunk
	for size < cs && rest >= uint64(streams)*size {
		rounds = append(rounds, size)
		rest -= uint64(streams) * size
		size *= 2
	}
	if len(rounds) == 0 {
		return nil // too little for even one round of the smallest chunk
	}
	size = min(size, cs)
	// What is left in front, in as few chunks of at most size as hold
	// it, of equal lengths (to a byte).
	n := (rest + size - 1) / size
	out := make([]uint32, 0, int(n)+len(rounds)*streams)
	for i := uint64(0); i < n; i++ {
		k := rest / n
		if i < rest%n {
			k++
		}
		out = append(out, uint32(k))
	}
	for i := len(rounds) - 1; i >= 0; i-- {
		for range streams {
			out = append(out, uint32(rounds[i]))
		}
	}
	return out
}

// SplitTail cuts the end of the plan finer for a session of streams data
// streams, down to chunks of minChunk bytes (tailSizes). It must come
// before any chunk is cut (the core calls it when the transfer is
// submitted) and reports whether the plan changed; it leaves the plan as
// it is when no chunk would change, when a chunk was cut already, or when
// the count would pass what a receiver accepts (MaxRecvChunks).
func (p *Plan) SplitTail(streams int, minChunk uint32) bool {
	if len(p.chunks) > 0 || p.tail != nil {
		return false
	}
	sizes := tailSizes(p.Total, p.cs, streams, uint64(minChunk))
	if sizes == nil {
		return false
	}
	var tailBytes uint64
	for _, n := range sizes {
		tailBytes += uint64(n)
	}
	head := int((p.Total - tailBytes) / p.cs)
	n := head + len(sizes)
	if n > MaxRecvChunks && n > p.n {
		return false
	}
	p.head, p.tail, p.n = head, sizes, n
	p.chunks = make([]Chunk, 0, n)
	return true
}

// offset is where chunk i starts in the transfer's bytes.
func (p *Plan) offset(i int) uint64 {
	if p.tail == nil || i <= p.head {
		return uint64(i) * p.cs
	}
	off := uint64(p.head) * p.cs
	for _, n := range p.tail[:i-p.head] {
		off += uint64(n)
	}
	return off
}
