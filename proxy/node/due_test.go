package node

import (
	"testing"
	"time"

	"github.com/stage-kv/stage/internal/spin"
)

// TestDueClock: only a DirectDone of the push handed last, with all its
// bytes, sets the pace; the next push is due by it, and a done ends the
// wait for it. (spin.Due's Plan is TestDuePlan's.)
func TestDueClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var c dueClock
	if d := c.due(); d != (spin.Due{}) {
		t.Fatalf("nothing handed: due %+v", d)
	}
	c.handed(t0, 1000)
	if d := c.due(); d != (spin.Due{}) {
		t.Fatalf("no pace yet: due %+v", d)
	}
	c.done(t0.Add(time.Millisecond), 0) // gave up on the direct path
	if c.pace != 0 {
		t.Fatalf("a DirectDone of 0 bytes set the pace to %v ns/B", c.pace)
	}
	c.handed(t0, 1000)
	c.done(t0.Add(time.Millisecond), 999) // not the push handed
	if c.pace != 0 {
		t.Fatalf("a DirectDone of other bytes set the pace to %v ns/B", c.pace)
	}
	c.handed(t0, 1000)
	c.done(t0.Add(2*time.Millisecond), 1000)
	if c.pace != 2000 {
		t.Fatalf("pace %v ns/B, want 2000", c.pace)
	}
	if d := c.due(); d != (spin.Due{}) {
		t.Fatalf("after the DirectDone the reader still waits by it: %+v", d)
	}
	t1 := t0.Add(time.Second)
	c.handed(t1, 4000)
	if d, want := c.due(), (spin.Due{Start: t1, Expect: 8 * time.Millisecond}); d != want {
		t.Fatalf("due %+v, want %+v", d, want)
	}
}
