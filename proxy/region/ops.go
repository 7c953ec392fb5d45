package region

import (
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/staging"
	"github.com/stage-kv/stage/wire"
)

// Checked is what one pass over an engine's ops finds: how far into
// each remote region the transfer reaches, its total, and (for a push)
// the ops as the chunk planner takes them.
type Checked struct {
	Ends  []uint64 // per remote name: the highest RemoteOff+Len
	Total uint64
	Plan  []staging.PlanOp // push only
}

// CheckOps checks every op of m against regions (m.LocalNames' regions, in
// order): indexes in range, no empty op, the local range inside its region
// and the remote range not overflowing, all without overflow; and, with
// push, converts each op to a plan op. It reads every op once and calls
// nothing per op, so a push of 65,536 blocks is checked in well under a
// millisecond. Nothing is kept on error.
func CheckOps(m *wire.Submit, regions []*Region, push bool) (*Checked, error) {
	// The regions' lengths and device addresses, looked up once.
	lens := make([]uint64, len(regions))
	bases := make([]device.Addr, len(regions))
	for i, r := range regions {
		lens[i], bases[i] = r.Len, r.Addr(0)
	}
	c := &Checked{Ends: make([]uint64, len(m.RemoteNames))}
	if push {
		c.Plan = make([]staging.PlanOp, len(m.Ops))
	}
	nl, nr := uint64(len(regions)), uint64(len(m.RemoteNames))
	for i := range m.Ops {
		op := &m.Ops[i]
		if uint64(op.Local) >= nl || uint64(op.Remote) >= nr {
			return nil, status.Errorf(wire.CodeBadRequest, "op %d names region #%d/#%d of %d/%d", i, op.Local, op.Remote, nl, nr)
		}
		if op.Len == 0 || !InRange(op.LocalOff, op.Len, lens[op.Local]) {
			_, err := regions[op.Local].Seg(op.LocalOff, op.Len) // says what is wrong
			return nil, status.Errorf(wire.CodeOutOfRange, "op %d: %w", i, err)
		}
		end := op.RemoteOff + op.Len
		if end < op.RemoteOff {
			return nil, status.Errorf(wire.CodeOutOfRange, "op %d: remote offset %d + length %d overflows", i, op.RemoteOff, op.Len)
		}
		if end > c.Ends[op.Remote] {
			c.Ends[op.Remote] = end
		}
		if c.Total+op.Len < c.Total {
			return nil, status.Errorf(wire.CodeOutOfRange, "transfer length overflows")
		}
		c.Total += op.Len
		if push {
			c.Plan[i] = staging.PlanOp{Src: bases[op.Local] + device.Addr(op.LocalOff), DstRegion: op.Remote, DstOff: op.RemoteOff, Len: op.Len}
		}
	}
	return c, nil
}
