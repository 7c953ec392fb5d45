package proxy

import (
	"fmt"
	"testing"

	"github.com/stage-kv/stage/staging"
)

// The answer table on its own: each step's result and what lookup finds
// after it, for ids of ours (odd) and the peer's (even).
func TestAnswerTable(t *testing.T) {
	ix1, ix2 := &inlineXfer{stream: 1}, &inlineXfer{stream: 2}
	type step struct {
		op   string // expect, inline, serve, forget, retire, take, close
		id   uint64
		a    answerer
		key  staging.Key
		want string // the step's result, "" for none
	}
	for _, tc := range []struct {
		name  string
		steps []step
		look  map[uint64]answerer // lookup(id, id is even) after the steps
	}{
		{"a push listed and forgotten",
			[]step{{op: "expect", id: 3, a: corePush(1)}, {op: "forget", id: 3, a: corePush(1)}},
			map[uint64]answerer{3: nil}},
		{"forget leaves another entry under the id",
			[]step{{op: "expect", id: 3, a: corePush(1)}, {op: "forget", id: 3, a: corePush(2)}},
			map[uint64]answerer{3: corePush(1)}},
		{"a served pull listed once; a second is a duplicate",
			[]step{{op: "serve", id: 4, key: 100, want: "dup false closed false"}, {op: "serve", id: 4, key: 101, want: "dup true closed false"}},
			map[uint64]answerer{4: coreServed(100)}},
		{"a retired served pull still resolves, for the peer's ids only",
			[]step{{op: "serve", id: 4, key: 100, want: "dup false closed false"}, {op: "retire", id: 4, key: 100}, {op: "serve", id: 6, key: 7, want: "dup false closed false"}},
			map[uint64]answerer{4: coreServed(100), 6: coreServed(7)}},
		{"retire does not take a push listed under the id",
			[]step{{op: "expect", id: 4, a: corePush(9)}, {op: "retire", id: 4, key: 100}},
			map[uint64]answerer{4: corePush(9)}},
		{"a small push is taken once",
			[]step{{op: "inline", id: 5, a: ix1, want: "true"}, {op: "take", id: 5, want: "taken"}, {op: "take", id: 5, want: "none"}},
			map[uint64]answerer{5: nil}},
		{"take leaves a push that is not small",
			[]step{{op: "expect", id: 5, a: corePush(2)}, {op: "take", id: 5, want: "none"}},
			map[uint64]answerer{5: corePush(2)}},
		{"closed: no small push or served pull is listed, pushes through the core still are",
			[]step{{op: "inline", id: 5, a: ix1, want: "true"}, {op: "close"}, {op: "inline", id: 7, a: ix2, want: "false"},
				{op: "serve", id: 4, key: 100, want: "dup false closed true"}, {op: "expect", id: 9, a: corePush(4)}},
			map[uint64]answerer{5: ix1, 7: nil, 4: nil, 9: corePush(4)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newAnswerTable()
			for i, st := range tc.steps {
				got := ""
				switch st.op {
				case "expect":
					tb.expect(st.id, st.a)
				case "inline":
					got = fmt.Sprint(tb.expectInline(st.id, st.a.(*inlineXfer)))
				case "serve":
					dup, closed := tb.serve(st.id, st.key)
					got = fmt.Sprintf("dup %v closed %v", dup, closed)
				case "forget":
					tb.forget(st.id, st.a)
				case "retire":
					tb.retire(st.id, st.key)
				case "take":
					got = "none"
					if tb.takeInline(st.id) != nil {
						got = "taken"
					}
				case "close":
					tb.close()
				}
				if got != st.want {
					t.Fatalf("step %d (%s %d): got %q, want %q", i, st.op, st.id, got, st.want)
				}
			}
			for id, want := range tc.look {
				if got := tb.lookup(id, id%2 == 0); got != want {
					t.Errorf("lookup(%d) = %#v, want %#v", id, got, want)
				}
			}
		})
	}
}

// takeInlines takes the small pushes keep refuses (all with keep nil),
// leaves the rest and every other kind, and inlines counts what is left.
func TestAnswerTableTakeInlines(t *testing.T) {
	for _, tc := range []struct {
		name      string
		keep      func(*inlineXfer) bool
		taken     int
		left      int
		otherKept bool
	}{
		{"all", nil, 3, 0, true},
		{"those of stream 1", func(ix *inlineXfer) bool { return ix.stream != 1 }, 2, 1, true},
		{"none", func(*inlineXfer) bool { return true }, 0, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newAnswerTable()
			tb.expectInline(1, &inlineXfer{stream: 1})
			tb.expectInline(3, &inlineXfer{stream: 1})
			tb.expectInline(5, &inlineXfer{stream: 2})
			tb.expect(7, corePush(3))
			tb.serve(8, 40)
			if got := len(tb.takeInlines(tc.keep)); got != tc.taken {
				t.Errorf("took %d, want %d", got, tc.taken)
			}
			if got := tb.inlines(); got != tc.left {
				t.Errorf("%d small pushes left, want %d", got, tc.left)
			}
			if tb.lookup(7, false) != corePush(3) || tb.lookup(8, true) != coreServed(40) {
				t.Error("took an entry that is not a small push")
			}
		})
	}
}
