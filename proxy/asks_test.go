package proxy

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stage-kv/stage/wire"
)

// A request to the peer gets its answer, or says why it got none: the
// session closed, or its time ran out. Answers nobody waits for are
// dropped without blocking.
func TestAsk(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer bool // the peer answers seq 1
		close  bool // the session closes
		want   error
	}{
		{"answered", true, false, nil},
		{"session closed", false, true, errAskGone},
		{"no answer in time", false, false, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss := &session{done: make(chan struct{})}
			var w waiting[int]
			ss.sent = func(m wire.Msg) {
				if tc.answer {
					w.answer(m.(*wire.CatalogRequest).Seq, 42)
				}
				if tc.close {
					close(ss.done)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			v, err := ask(ctx, ss, &w, 1, &wire.CatalogRequest{Seq: 1})
			if !errors.Is(err, tc.want) || (err == nil && v != 42) {
				t.Fatalf("got %d, %v; want 42 or error %v", v, err, tc.want)
			}
			if len(w.m) != 0 {
				t.Fatalf("%d requests still waiting after ask returned", len(w.m))
			}
			w.answer(1, 7) // late, or never asked: dropped
			w.answer(9, 7)
		})
	}
}
