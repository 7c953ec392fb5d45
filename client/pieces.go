package client

import (
	"context"
	"sync"
	"time"

	"github.com/stage-kv/stage/wire"
)

// A large Submit in pieces (PROTOCOL.md 9.5b): the first ops go in a
// SubmitHead with the whole list's Total and Ends, the rest in SubmitMore
// frames, so that the sidecar checks and starts the first chunks while
// this side still encodes and writes the rest. Used only when the sidecar
// says it takes them (QueryFeatures); an older one gets one Submit.

// DefaultPieceOps is the op count above which Submit and Do send in
// pieces, and DefaultFirstPiece and DefaultPiece the ops of the first and
// of each later piece: the first is small so that the sidecar starts soon
// (1,024 x 16 KiB blocks fill four 4 MiB chunks), the later ones large so
// that a piece costs little. Measured on a 2-core CPU loopback
// (TestMeasurePiecesFirstChunk, nine interleaved rounds): 65,536 ops
// reached the wire after 5.0 ms in pieces against 7.0 ms in one frame
// (medians), 8,192 ops 3.7 against 5.4 ms with spreads that overlap,
// 2,048 ops no difference beyond the spread; hence pieces from 16,384 ops
// (a 512 KiB Submit) on.
const (
	DefaultPieceOps   = 16384
	DefaultFirstPiece = 1024
	DefaultPiece      = 8192
)

// piecesConf is how a client splits large requests.
type piecesConf struct {
	above, first, rest int // above 0: never in pieces

	mu    sync.Mutex
	asked bool
	ok    bool // the sidecar takes requests in pieces
	max   wire.PiecesLimits
}

func defaultPieces() piecesConf {
	return piecesConf{above: DefaultPieceOps, first: DefaultFirstPiece, rest: DefaultPiece}
}

// WithPieces sends a Submit or Do of more than above ops in pieces: the
// first of first ops, the others of rest ops (PROTOCOL.md 9.5b), when the
// sidecar takes them. above 0 always sends one frame. The defaults are
// DefaultPieceOps, DefaultFirstPiece and DefaultPiece.
func WithPieces(above, first, rest int) Option {
	return func(c *Client) {
		c.pieces.above, c.pieces.first, c.pieces.rest = max(above, 0), max(first, 1), max(rest, 1)
	}
}

// piecesOK reports whether the sidecar takes requests in pieces, asking
// it once (QueryFeatures; an older sidecar answers Fail, which means no).
func (c *Client) piecesOK(ctx context.Context) (bool, wire.PiecesLimits) {
	p := &c.pieces
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.asked {
		var f wire.Features
		err := c.query(ctx, wire.QueryFeatures, "", &f)
		if err != nil && ctx.Err() != nil {
			return false, wire.PiecesLimits{} // ask again next time
		}
		p.asked = true
		if err == nil && f.SubmitPieces != nil {
			p.ok, p.max = true, *f.SubmitPieces
		}
	}
	return p.ok, p.max
}

// submit sends t as Submit (wait: SubmitWait), in pieces when it is large
// and the sidecar takes them, and returns the answer.
func (c *Client) submit(ctx context.Context, t Transfer, wait bool) (a wire.Msg, err error) {
	req := c.next()
	if wait && c.kick != nil { // the client polls: its reader can wait for the answer as due
		key, n, start := paceKey(&t), opsBytes(&t), time.Now()
		if c.dues.expect(req, key, n, start) {
			c.kick.Wake() // the reader plans for the answer
		}
		defer func() { c.dues.settle(req, key, n, start, time.Now(), err == nil && moved(a)) }()
	}
	m := wire.Submit{Req: req, Route: t.Route, Dir: t.Dir, Checksum: t.Checksum, Tag: t.Tag,
		LocalNames: t.LocalNames, RemoteNames: t.RemoteNames, Ops: t.Ops, Peer: t.Peer}
	if p := &c.pieces; p.above > 0 && len(t.Ops) > p.above {
		if ok, lim := c.piecesOK(ctx); ok {
			if h, err := headOf(&m, wait); err == nil && fits(len(t.Ops), p.first, p.rest, lim) {
				return c.callWith(ctx, req, h, func() error { return c.sendPieces(h, t.Ops, p.first, p.rest) })
			}
			// Ops the head cannot declare (a bad op) go whole: the
			// sidecar says what is wrong with them.
		}
	}
	if wait {
		return c.call(ctx, req, &wire.SubmitWait{Submit: m}, -1)
	}
	return c.call(ctx, req, &m, -1)
}

// fits reports whether n ops, first in the head and rest in each later
// piece (an End at least, empty when the head held them all), stay within
// the sidecar's limits.
func fits(n, first, rest int, lim wire.PiecesLimits) bool {
	pieces := 1 + max(1, (max(n-first, 0)+rest-1)/rest)
	return n <= lim.MaxOps && pieces <= lim.MaxPieces
}

// headOf is the SubmitHead of m (its Ops are all of them; the caller cuts
// them into pieces): Total and Ends over every op.
func headOf(m *wire.Submit, wait bool) (*wire.SubmitHead, error) {
	h := &wire.SubmitHead{Submit: *m, Wait: wait, Ends: make([]uint64, len(m.RemoteNames))}
	for i := range m.Ops {
		op := &m.Ops[i]
		end := op.RemoteOff + op.Len
		if int(op.Remote) >= len(h.Ends) || end < op.RemoteOff || h.Total+op.Len < h.Total {
			return nil, errBadOp
		}
		h.Ends[op.Remote] = max(h.Ends[op.Remote], end)
		h.Total += op.Len
	}
	if h.Total == 0 {
		return nil, errBadOp
	}
	return h, nil
}

var errBadOp = &Error{Code: wire.CodeBadRequest, Msg: "an op the sidecar would refuse"}

// sendPieces writes h with its first ops, then the rest in SubmitMore
// frames, each encoded while the sidecar reads the one before.
func (c *Client) sendPieces(h *wire.SubmitHead, ops []wire.LocalOp, first, rest int) error {
	k := min(first, len(ops))
	head := *h
	head.Ops = ops[:k]
	buf := wire.AppendFrame(make([]byte, 0, 64<<10), &head, false, 0)
	if _, err := c.conn.Write(buf); err != nil {
		return err
	}
	for {
		ops = ops[k:]
		k = min(rest, len(ops))
		more := wire.SubmitMore{Req: h.Req, End: k == len(ops), Ops: ops[:k]}
		buf = wire.AppendFrame(buf[:0], &more, false, 0)
		if _, err := c.conn.Write(buf); err != nil {
			return err
		}
		if more.End {
			return nil
		}
	}
}
