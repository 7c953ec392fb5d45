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
	nsPerByte float64 // the last copy's pace; 0 until one was seen
	start     time.Time
	bytes     uint64
}

// handed records that the handles of a push of n bytes went out at now.
func (c *dueClock) handed(now time.Time, n uint64) { c.start, c.bytes = now, n }

// done records the DirectDone of the push handed last, at now, and learns
// its pace from it.
func (c *dueClock) done(now time.Time, n uint64) {
	if c.start.IsZero() || n == 0 || n != c.bytes {
		c.start = time.Time{}
		return
	}
	if el := now.Sub(c.start); el > 0 {
		c.nsPerByte = float64(el) / float64(n)
	}
	c.start = time.Time{}
}

// due is when the DirectDone of the push handed last should come: zero
// with none handed or no pace learned yet.
func (c *dueClock) due() spin.Due {
	if c.start.IsZero() || c.nsPerByte == 0 {
		return spin.Due{}
	}
	return spin.Due{Start: c.start, Expect: time.Duration(c.nsPerByte * float64(c.bytes))}
}
