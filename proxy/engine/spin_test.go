package engine

import (
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// TestAdaptiveSpinReader: an engine connection's reader under an adaptive
// staging.read_spin times its waits for requests, each sent a steady 500 us
// after the answer to the last was read (a push checked after each), and
// applies the adaptive rule to them.
func TestAdaptiveSpinReader(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s", "c.sock")
	l, err := Listen(path, fakeBackend{done: make(chan struct{})}, zap.NewNop(), Options{MaxClients: 4, ReadSpin: spin.Auto()})
	if err != nil {
		t.Fatal(err)
	}
	l.Serve()
	closed := false
	defer func() {
		if !closed {
			l.Close()
		}
	}()
	const (
		queries = 48
		pace    = 500 * time.Microsecond
	)
	c := dial(t, path)
	for i := range queries {
		// The pace runs from the last answer. A busy wait holds it
		// better than a timer on a loaded machine.
		for next := time.Now().Add(pace); time.Now().Before(next); {
		}
		if err := unixsock.WriteFrame(c, &wire.Query{Req: uint64(i + 1), What: wire.QueryStats}, -1); err != nil {
			t.Fatal(err)
		}
		if m, ok := readMsg(t, c).(*wire.QueryReply); !ok || m.Req != uint64(i+1) {
			t.Fatalf("query %d answered %#v", i+1, m)
		}
	}
	l.mu.Lock()
	cls := slices.Collect(maps.Keys(l.clients))
	l.mu.Unlock()
	if len(cls) != 1 {
		t.Fatalf("%d connections, want 1", len(cls))
	}
	l.Close() // waits for the reader: its window can be read
	closed = true
	w := &cls[0].rwait
	waits := w.Waits()
	if len(waits) < 4 {
		t.Fatalf("the reader timed %d waits of %d requests, each sent after the last was answered", len(waits), queries)
	}
	// Each wait is the pace and the answer's way to the test, from when
	// the reader had answered; a loaded machine stretches some.
	long := len(slices.DeleteFunc(slices.Clone(waits), func(d time.Duration) bool { return d < pace/2 }))
	if long < len(waits)/2 {
		t.Fatalf("requests came %s after the last answer; most of the reader's waits are shorter than half that: %v", pace, waits)
	}
	// The window follows from the waits by spin's rule (TestAdaptiveNext);
	// which window that is depends on how steady the machine kept the pace.
	if want := spin.Auto().WindowAfter(waits...); w.Next() != want {
		t.Fatalf("after waits %v the window is %s, the rule gives %s", waits, w.Next(), want)
	}
}
