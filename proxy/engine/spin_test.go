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
// staging.read_spin times its waits for requests and widens its window to
// a steady pace of requests 500 us apart (each answered and the answer
// read before the next: a push checked after each), which the base
// window would not cover.
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
	next := time.Now()
	for i := range queries {
		// A busy wait holds the pace better than a timer on a loaded
		// machine.
		for next = next.Add(pace); time.Now().Before(next); {
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
	if len(waits) < 8 {
		t.Fatalf("the reader recorded %d waits of %d requests, want most", len(waits), queries)
	}
	s := slices.Sorted(slices.Values(waits))
	// Each wait is the pace less the answer's round trip (about 100-200
	// us here under the race detector): longer than the base window.
	if med := s[len(s)/2]; med <= spin.Window {
		t.Fatalf("requests came %s apart; the reader's median wait is %s (%v), want above the base %s", pace, med, waits, spin.Window)
	}
	// The rule is spin's (TestAdaptiveNext); here: the reader applies it.
	// On a loaded machine two stalls past the cap rightly leave the base.
	if s[len(s)-2] <= spin.MaxWindow && w.Next() < s[len(s)-2] {
		t.Fatalf("waits %v left the window at %s", waits, w.Next())
	}
}
