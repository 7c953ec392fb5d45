package node

import (
	"time"

	"github.com/stage-kv/stage/internal/spin"
)

// When the exporter's next frame is due. After it hands out the handles of
// an ipc push, the exporter's next frame on that connection is the
// importer's DirectDone, once the copy is over: a 4 GiB copy takes 11 ms
// over NVLink, far past the readers' polling window (answerSpin), so the
// reader would sleep and the DirectDone would wait for its thread to be
// woken, in every push's critical path (docs/BENCHMARKS.md, the ipc row).
// Knowing how long the peer's last copy on this connection took per byte,
// the reader waits for the DirectDone as a message due (spin.Due).

// dueClock estimates when an ipc push's DirectDone comes back on one node
// connection from the copies seen on it. It is not safe for concurrent use
// (one reader owns it).
type dueClock struct {
	pace  spin.Pace // the last copy's; 0 until one was seen
	start time.Time // when the handles of the push handed last went out; zero: none waiting
	bytes uint64
}

// handed records that the handles of a push of n bytes went out at now.
func (c *dueClock) handed(now time.Time, n uint64) { c.start, c.bytes = now, n }

// done records the DirectDone of the push handed last, at now, and learns
// its pace from it (only from one that moved all of it).
func (c *dueClock) done(now time.Time, n uint64) {
	if !c.start.IsZero() && n == c.bytes {
		if p := spin.PaceOf(now.Sub(c.start), n); p > 0 {
			c.pace = p
		}
	}
	c.start = time.Time{}
}

// due is when the DirectDone of the push handed last should come: zero
// with none handed or no pace learned yet.
func (c *dueClock) due() spin.Due { return c.pace.Due(c.start, c.bytes) }
