package region

import (
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/internal/fanout"
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
// nothing per op. Nothing is kept on error. A large push (65,536 scattered
// blocks) is checked in parallel slices on a machine with cores to spare:
// the check is on the path from the engine's Submit to the first chunk.
func CheckOps(m *wire.Submit, regions []*Region, push bool) (*Checked, error) {
	k := fanout.Auto(len(m.Ops), minSlice)
	if k <= 1 {
		return checkOps(m, regions, push)
	}
	c := newChecked(m, push)
	lens, bases := regionBases(regions)
	ends := make([][]uint64, k)
	totals := make([]uint64, k)
	bad := make([]bool, k)
	fanout.Run(len(m.Ops), k, func(j, lo, hi int) {
		ends[j] = make([]uint64, len(m.RemoteNames))
		var plan []staging.PlanOp
		if push {
			plan = c.Plan[lo:hi]
		}
		totals[j], bad[j] = sliceOps(m.Ops[lo:hi], lens, bases, ends[j], plan)
	})
	for j := range k {
		sum := c.Total + totals[j]
		if bad[j] || sum < c.Total {
			// Something is wrong: the serial check finds the first problem
			// in op order and says what it is, as it always did.
			return checkOps(m, regions, push)
		}
		c.Total = sum
		for r, e := range ends[j] {
			c.Ends[r] = max(c.Ends[r], e)
		}
	}
	return c, nil
}

// minSlice is the fewest ops a parallel slice gets: below it, starting
// goroutines costs more than the check (about 10-25 ns an op).
const minSlice = 8192

// sliceOps is the fast path of one slice: it raises ends, writes plan (when
// not nil) and returns the slice's total, or bad on any problem (the caller
// then runs checkOps for the error).
func sliceOps(ops []wire.LocalOp, lens []uint64, bases []device.Addr, ends []uint64, plan []staging.PlanOp) (total uint64, bad bool) {
	nl, nr := uint64(len(lens)), uint64(len(ends))
	for i := range ops {
		op := &ops[i]
		if uint64(op.Local) >= nl || uint64(op.Remote) >= nr || op.Len == 0 || !InRange(op.LocalOff, op.Len, lens[op.Local]) {
			return 0, true
		}
		end := op.RemoteOff + op.Len
		if end < op.RemoteOff || total+op.Len < total {
			return 0, true
		}
		ends[op.Remote] = max(ends[op.Remote], end)
		total += op.Len
		if plan != nil {
			plan[i] = staging.PlanOp{Src: bases[op.Local] + device.Addr(op.LocalOff), DstRegion: op.Remote, DstOff: op.RemoteOff, Len: op.Len}
		}
	}
	return total, false
}

func newChecked(m *wire.Submit, push bool) *Checked {
	c := &Checked{Ends: make([]uint64, len(m.RemoteNames))}
	if push {
		c.Plan = make([]staging.PlanOp, len(m.Ops))
	}
	return c
}

// regionBases are the regions' lengths and device addresses, looked up once.
func regionBases(regions []*Region) ([]uint64, []device.Addr) {
	lens := make([]uint64, len(regions))
	bases := make([]device.Addr, len(regions))
	for i, r := range regions {
		lens[i], bases[i] = r.Len, r.Addr(0)
	}
	return lens, bases
}

// checkOps is CheckOps in one pass, with the error of the first bad op.
func checkOps(m *wire.Submit, regions []*Region, push bool) (*Checked, error) {
	lens, bases := regionBases(regions)
	c := newChecked(m, push)
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
