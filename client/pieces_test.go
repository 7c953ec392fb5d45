package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"testing"

	"github.com/stage-kv/stage/wire"
)

// fakeSidecar answers QueryFeatures as an old sidecar (Fail) or a new one,
// answers a Submit or the End of a request in pieces with Submitted, and
// reports the frames it read, "Type:ops" each, on frames.
func fakeSidecar(t *testing.T, old bool) (path string, frames chan string) {
	t.Helper()
	path, ln := listenSidecar(t)
	frames = make(chan string, 1024)
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		var buf []byte
		for {
			var m wire.Msg
			_, m, buf, err = wire.ReadFrame(c, buf)
			if err != nil {
				if !errors.Is(err, io.EOF) {
					frames <- "error " + err.Error()
				}
				return
			}
			var answer wire.Msg
			switch m := m.(type) {
			case *wire.Query:
				frames <- "Query"
				answer = &wire.Fail{Req: m.Req, Code: wire.CodeBadRequest, Message: "unknown query 6"}
				if !old {
					js, _ := json.Marshal(wire.OurFeatures())
					answer = &wire.QueryReply{Req: m.Req, JSON: js}
				}
			case *wire.Submit:
				frames <- fmt.Sprintf("Submit:%d", len(m.Ops))
				answer = &wire.Submitted{Req: m.Req, Transfer: 1}
			case *wire.SubmitHead:
				frames <- fmt.Sprintf("SubmitHead:%d total %d ends %v", len(m.Ops), m.Total, m.Ends)
			case *wire.SubmitMore:
				frames <- fmt.Sprintf("SubmitMore:%d %v", len(m.Ops), m.End)
				if m.End {
					answer = &wire.Submitted{Req: m.Req, Transfer: 2}
				}
			}
			if answer != nil {
				if _, err := c.Write(wire.AppendFrame(nil, answer, false, 0)); err != nil {
					return
				}
			}
		}
	}()
	return path, frames
}

func manyOps(n int) Transfer {
	t := Transfer{Route: "r", Dir: wire.Push, LocalNames: []string{"a"}, RemoteNames: []string{"b", "c"}}
	for i := range n {
		t.Ops = append(t.Ops, wire.LocalOp{Remote: uint32(i % 2), LocalOff: uint64(i) * 16, RemoteOff: uint64(i) * 32, Len: 16})
	}
	return t
}

func TestSubmitInPieces(t *testing.T) {
	for _, tc := range []struct {
		name string
		old  bool
		ops  int
		want []string
	}{
		{"small: one frame, no question", false, 10, []string{"Submit:10"}},
		{"old sidecar: one frame", true, 25, []string{"Query", "Submit:25"}},
		{"new sidecar: pieces", false, 25, []string{"Query", "SubmitHead:4 total 400 ends [784 752]", "SubmitMore:10 false", "SubmitMore:10 false", "SubmitMore:1 true"}},
		{"head holds all: an empty End", false, 21, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, frames := fakeSidecar(t, tc.old)
			c, err := Dial(path, WithSpin(0), WithPieces(20, 4, 10))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tc.want == nil { // first piece of 30: all 21 ops in the head
				c.pieces.first = 30
				tc.want = []string{"Query", "SubmitHead:21 total 336 ends [656 624]", "SubmitMore:0 true"}
			}
			id, err := c.Submit(context.Background(), manyOps(tc.ops))
			if err != nil {
				t.Fatal(err)
			}
			if want := uint64(1); len(tc.want) > 2 && tc.want[1] != "Submit:25" {
				want = 2
				if id != want {
					t.Fatalf("transfer id %d, want %d (the answer to the End)", id, want)
				}
			}
			var got []string
			for range tc.want {
				got = append(got, <-frames)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("sidecar read %q, want %q", got, tc.want)
			}
			// The answer to QueryFeatures is kept: a second large submit asks nothing.
			if tc.ops > 20 {
				if _, err := c.Submit(context.Background(), manyOps(tc.ops)); err != nil {
					t.Fatal(err)
				}
				if f := <-frames; f == "Query" {
					t.Fatal("asked QueryFeatures twice")
				}
			}
		})
	}
}

func TestHeadOf(t *testing.T) {
	m := &wire.Submit{RemoteNames: []string{"a", "b", "c"}, Ops: []wire.LocalOp{
		{Remote: 2, RemoteOff: 100, Len: 5}, {Remote: 0, RemoteOff: 0, Len: 1}, {Remote: 2, RemoteOff: 10, Len: 5}}}
	h, err := headOf(m, true)
	if err != nil || h.Total != 11 || !reflect.DeepEqual(h.Ends, []uint64{1, 0, 105}) || !h.Wait {
		t.Fatalf("got %+v, %v; want Total 11, Ends [1 0 105], Wait", h, err)
	}
	for _, bad := range [][]wire.LocalOp{
		{{Remote: 3, Len: 1}},
		{{RemoteOff: math.MaxUint64, Len: 1}},
		{{Len: math.MaxUint64}, {Len: 1}},
		{{Len: 0}},
	} {
		if _, err := headOf(&wire.Submit{RemoteNames: m.RemoteNames, Ops: bad}, false); err == nil {
			t.Errorf("ops %+v: no error", bad)
		}
	}
}

func TestPiecesFit(t *testing.T) {
	lim := wire.PiecesLimits{MaxPieces: 4, MaxOps: 100}
	for _, tc := range []struct {
		n, first, rest int
		want           bool
	}{
		{10, 20, 5, true},  // head and an empty End
		{35, 5, 10, true},  // 1 + 3
		{36, 5, 10, false}, // 1 + 4
		{101, 50, 100, false},
	} {
		if got := fits(tc.n, tc.first, tc.rest, lim); got != tc.want {
			t.Errorf("fits(%d, %d, %d): %v, want %v", tc.n, tc.first, tc.rest, got, tc.want)
		}
	}
}
