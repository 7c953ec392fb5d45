package scenarios_test

import (
	"testing"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/proxy/proxytest"
)

// balanced turns on staging.balance_sockets and staging.tail_chunk (the
// smallest tail chunk, tail) on every sidecar of o.
func balanced(o proxytest.Options, tail config.ByteSize) proxytest.Options {
	o.Configure = func(_ string, c *config.Config) {
		c.Staging.BalanceSockets = true
		c.Staging.TailChunk = tail
	}
	return o
}

// TestBalancedMoves: with chunks placed by their sockets' bytes and the
// end of each transfer cut into chunks down to 4 KiB, ranges and
// scattered blocks (32 MiB), pushed and pulled over 4 streams, land byte-exact
// (the receiver takes chunks of every length the tail cut).
func TestBalancedMoves(t *testing.T) {
	for _, tc := range shapes {
		t.Run(tc.name, func(t *testing.T) {
			o := balanced(e2eOpts(), 4*config.KiB)
			o.Stripes = 4
			pre, dec := proxytest.Pair(t, o)
			moveAndVerify(t, pre, dec, tc.dir, tc.moves)
		})
	}
}

// TestBalancedKV: a KV transfer's chunks (each names its offset in the
// canonical stream) cut at the tail land where the receiver's layout
// says.
func TestBalancedKV(t *testing.T) { kvBlockMajor(t, balanced(e2eOpts(), 4*config.KiB)) }

// TestTailChunkAboveHalfSlot: a tail chunk that could cut nothing (above
// half a slot) is said at start, and transfers still move whole.
func TestTailChunkAboveHalfSlot(t *testing.T) {
	pre, dec := proxytest.Pair(t, balanced(e2eOpts(), config.MiB)) // slots of 1 MiB
	waitLogged(t, pre, "staging.tail_chunk is above half of staging.slot_size")
	moveAndVerify(t, pre, dec, shapes[0].dir, shapes[0].moves)
}
