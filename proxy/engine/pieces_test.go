package engine

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// TestPieceBook walks a connection's requests in pieces through the book:
// each step is a head, a piece or a clock reading, with what the book must
// decide.
func TestPieceBook(t *testing.T) {
	t0 := time.Unix(100, 0)
	lim := pieceLimits{pieces: 3, ops: 10, rest: time.Second, open: 2}
	type step struct {
		op      string // "head", "more", "end", "fail", "expire", "close"
		req     uint64
		ops     int
		at      time.Duration
		verdict pieceVerdict
		code    wire.Code // 0: no error
		msg     string
		late    []uint64 // expire, close
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"in order", []step{
			{op: "head", req: 1, ops: 4}, {op: "more", req: 1, ops: 4, verdict: pieceGrow}, {op: "end", req: 1, ops: 2, verdict: pieceGrow},
			{op: "more", req: 1, ops: 1, code: wire.CodeBadRequest, msg: "no open request"},
			{op: "expire", at: time.Hour},
		}},
		{"head alone then end", []step{{op: "head", req: 1, ops: 10}, {op: "end", req: 1, verdict: pieceGrow}}},
		{"piece without head", []step{{op: "more", req: 9, ops: 1, code: wire.CodeBadRequest, msg: "no SubmitHead"}}},
		{"end without head", []step{{op: "end", req: 9, code: wire.CodeBadRequest, msg: "request 9"}}},
		{"same req twice", []step{{op: "head", req: 1}, {op: "head", req: 1, code: wire.CodeBadRequest, msg: "open already"}}},
		{"too many open", []step{{op: "head", req: 1}, {op: "head", req: 2}, {op: "head", req: 3, code: wire.CodeBusy, msg: "2 requests"},
			{op: "end", req: 1, verdict: pieceGrow}, {op: "head", req: 3}}},
		{"head over ops", []step{{op: "head", req: 1, ops: 11, code: wire.CodeBadRequest, msg: "more than 10"}}},
		{"pieces over ops", []step{{op: "head", req: 1, ops: 6}, {op: "more", req: 1, ops: 5, code: wire.CodeBadRequest, msg: "more than 10 ops"},
			{op: "more", req: 1, ops: 1, verdict: pieceDrop}, {op: "end", req: 1, verdict: pieceDrop},
			{op: "more", req: 1, code: wire.CodeBadRequest, msg: "no open request"}}},
		{"too many pieces", []step{{op: "head", req: 1}, {op: "more", req: 1, verdict: pieceGrow}, {op: "more", req: 1, verdict: pieceGrow},
			{op: "more", req: 1, code: wire.CodeBadRequest, msg: "more than 3 pieces"}, {op: "end", req: 1, verdict: pieceDrop}}},
		{"too many pieces at the end", []step{{op: "head", req: 1}, {op: "more", req: 1, verdict: pieceGrow}, {op: "more", req: 1, verdict: pieceGrow},
			{op: "end", req: 1, code: wire.CodeBadRequest, msg: "more than 3 pieces"}, {op: "more", req: 1, code: wire.CodeBadRequest, msg: "no open"}}},
		{"failed drops the rest", []step{{op: "head", req: 1}, {op: "fail", req: 1}, {op: "more", req: 1, verdict: pieceDrop},
			{op: "end", req: 1, verdict: pieceDrop}, {op: "expire", at: time.Hour}}},
		{"missing end times out", []step{{op: "head", req: 1}, {op: "head", req: 2, at: 500 * time.Millisecond},
			{op: "expire", at: 999 * time.Millisecond}, {op: "expire", at: time.Second, late: []uint64{1}},
			{op: "more", req: 1, code: wire.CodeBadRequest, msg: "1s passed"}, {op: "expire", at: 2 * time.Second, late: []uint64{2}}}},
		{"failed one expires silently", []step{{op: "head", req: 1}, {op: "fail", req: 1}, {op: "expire", at: time.Second}}},
		{"close", []step{{op: "head", req: 1}, {op: "head", req: 2}, {op: "fail", req: 2}, {op: "close", late: []uint64{1}},
			{op: "more", req: 1, code: wire.CodeBadRequest}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newPieceBook(lim)
			for i, s := range tc.steps {
				now := t0.Add(s.at)
				var (
					v    pieceVerdict
					err  error
					late []uint64
				)
				switch s.op {
				case "head":
					err = b.head(s.req, s.ops, now)
				case "more", "end":
					v, err = b.more(s.req, s.ops, s.op == "end")
				case "fail":
					b.failed(s.req)
				case "expire":
					late = b.expire(now)
				case "close":
					late = b.closeAll()
				}
				slices.Sort(late)
				if v != s.verdict || (err == nil) != (s.code == 0) || !slices.Equal(late, s.late) {
					t.Fatalf("step %d %+v: got verdict %d, error %v, late %v", i, s, v, err, late)
				}
				if err != nil && (status.Code(err) != s.code || !strings.Contains(err.Error(), s.msg)) {
					t.Fatalf("step %d %+v: got %v (code %s), want code %s naming %q", i, s, err, status.Code(err), s.code, s.msg)
				}
			}
		})
	}
}

func TestPieceBookNext(t *testing.T) {
	t0 := time.Unix(100, 0)
	b := newPieceBook(pieceLimits{pieces: 3, ops: 10, rest: time.Second, open: 4})
	if !b.next().IsZero() {
		t.Fatal("next of an empty book is not zero")
	}
	_ = b.head(1, 0, t0.Add(time.Second))
	_ = b.head(2, 0, t0)
	if got := b.next(); !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("next %v, want %v", got, t0.Add(time.Second))
	}
}
