package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/wire"
)

// cleanFailures are the codes a push to the victim may fail with: its
// session lost mid-push, its name or address no longer the route's.
var cleanFailures = map[wire.Code]bool{wire.CodePeerUnavailable: true, wire.CodeUnknownPeer: true, wire.CodeAccessDenied: true}

// landsIn is the instance a push that succeeded wrote to: the decode it
// named, or for the victim, the one alive when the push started.
func (m *mesh) landsIn(r *result) *decodeInst {
	if r.to == victim && r.from <= phaseKilling {
		return m.insts[victim]
	}
	return m.dec[r.to]
}

// judge says what is wrong with one push's outcome, or "".
func judge(r *result) string {
	took := r.end.Sub(r.start)
	if r.err != nil && errors.Is(r.err, context.DeadlineExceeded) {
		return fmt.Sprintf("hung: no answer in %v", meshHang)
	}
	if r.to != victim {
		if r.err != nil {
			return fmt.Sprintf("a push to a decode that never went away failed: %v", r.err)
		}
		return ""
	}
	if r.err != nil {
		if !cleanFailures[client.CodeOf(r.err)] {
			return fmt.Sprintf("failed with an unexpected code: %v", r.err)
		}
		if took > meshFailWithin {
			return fmt.Sprintf("took %v to fail (want under %v): %v", took, meshFailWithin, r.err)
		}
	}
	switch {
	case r.from == phaseUp && r.err != nil && r.ended == phaseUp:
		return fmt.Sprintf("failed before the victim was killed: %v", r.err)
	case r.from >= phaseKilled && r.from < phaseBack && r.err == nil && r.ended < phaseBack:
		return "succeeded while the victim was dead and no replacement ran"
	case r.from == phaseFound && r.err != nil:
		return fmt.Sprintf("failed after every route had the replacement up: %v", r.err)
	}
	return ""
}

// checkResults fails the test on every push whose outcome is wrong, and
// requires pushes to the victim while it was gone (all failed) and after
// it came back (all landed).
func (m *mesh) checkResults() {
	m.t.Helper()
	var bad []string
	var ok, failed, goneFailed, backOK, others, cut int
	var slowest time.Duration
	for p := range meshSides {
		for i := range m.n {
			r := &m.res[p][i]
			if !r.attempted {
				m.t.Fatalf("prefill-%d push %d never ran", p, i)
			}
			if why := judge(r); why != "" {
				bad = append(bad, fmt.Sprintf("prefill-%d push %d to %s (decode-%d, started %s, ended %s): %s",
					p, i, r.peer, r.to, phaseNames[r.from], phaseNames[r.ended], why))
			}
			if r.err == nil {
				ok++
			} else {
				failed++
				slowest = max(slowest, r.end.Sub(r.start))
			}
			switch {
			case r.to != victim:
				others++
			case r.from <= phaseKilling && r.err != nil:
				cut++
			case r.from == phaseGone && r.ended == phaseGone && r.err != nil:
				goneFailed++
			case r.from == phaseFound && r.err == nil:
				backOK++
			}
		}
	}
	if len(bad) > 0 {
		m.t.Fatalf("%d pushes went wrong; first ones:\n%s", len(bad), joinFirst(bad, 10))
	}
	if goneFailed == 0 || backOK == 0 {
		m.t.Fatalf("the run never tested the victim: %d pushes to it failed while it was gone, %d landed after it came back", goneFailed, backOK)
	}
	m.t.Logf("%d pushes landed, %d failed (all to decode-%d, the slowest in %v): %d cut by the kill, %d while it was gone; %d landed in its replacement after; %d to the other decodes, none failed",
		ok, failed, victim, slowest.Round(time.Millisecond), cut, goneFailed, backOK, others)
}

// checkRegions compares every decode instance's whole cache (guards
// included) with exactly what should be there: the bytes of the pushes
// that landed in it, each in its own slot, and the guard byte everywhere
// else. A push to the victim that failed because it was killed mid-push
// may have left its slot on the killed instance written or not.
func (m *mesh) checkRegions() {
	m.t.Helper()
	type slotWant struct {
		p, i  int
		loose bool // the killed victim, a push that was in flight: either is fine
	}
	want := map[*decodeInst]map[int]slotWant{}
	for _, inst := range m.insts {
		want[inst] = map[int]slotWant{}
	}
	for p := range meshSides {
		for i := range m.n {
			r := &m.res[p][i]
			slot := p*m.n + i
			switch {
			case r.err == nil:
				want[m.landsIn(r)][slot] = slotWant{p: p, i: i}
			case r.to == victim && r.from <= phaseKilling:
				want[m.insts[victim]][slot] = slotWant{p: p, i: i, loose: true}
			}
		}
	}
	for _, inst := range m.insts {
		got, err := inst.kv.Snapshot()
		if err != nil {
			m.t.Fatal(err)
		}
		exp := bytes.Repeat([]byte{guard}, len(got))
		loose := map[int]bool{}
		for slot, w := range want[inst] {
			off := meshSlot + slot*meshSlot // the cache's leading guard is one slot
			copy(exp[off:off+meshSlot], m.src[w.p][w.i*meshSlot:(w.i+1)*meshSlot])
			loose[slot] = w.loose
		}
		if bad := m.diff(got, exp, loose); bad != "" {
			m.t.Errorf("%s (at %s): %s", inst.sc.name, inst.sc.addr(), bad)
		}
	}
}

// diff compares a cache's snapshot with what it should hold, slot by
// slot, and names the first slots that differ and what they hold.
func (m *mesh) diff(got, exp []byte, loose map[int]bool) string {
	var bad []string
	for off := 0; off < len(got); off += meshSlot {
		g, e := got[off:off+meshSlot], exp[off:off+meshSlot]
		if bytes.Equal(g, e) {
			continue
		}
		slot := off/meshSlot - 1
		if loose[slot] && (bytes.Equal(g, bytes.Repeat([]byte{guard}, meshSlot)) || partly(g, e)) {
			continue
		}
		where := "a guard"
		if slot >= 0 && slot < meshSides*m.n {
			where = fmt.Sprintf("slot of prefill-%d push %d", slot/m.n, slot%m.n)
		}
		bad = append(bad, fmt.Sprintf("%s holds %s", where, m.whose(g)))
	}
	if len(bad) == 0 {
		return ""
	}
	return fmt.Sprintf("%d slots differ from what should have landed: %s", len(bad), joinFirst(bad, 5))
}

// partly: each byte of g is the guard or e's.
func partly(g, e []byte) bool {
	for i := range g {
		if g[i] != guard && g[i] != e[i] {
			return false
		}
	}
	return true
}

// whose names the push whose bytes b are, if any.
func (m *mesh) whose(b []byte) string {
	if bytes.Equal(b, bytes.Repeat([]byte{guard}, len(b))) {
		return "only the guard byte"
	}
	for p, src := range m.src {
		for i := range m.n {
			if bytes.Equal(b, src[i*meshSlot:(i+1)*meshSlot]) {
				return fmt.Sprintf("the bytes of prefill-%d push %d (sent to %s)", p, i, m.res[p][i].peer)
			}
		}
	}
	return "bytes of no push"
}

// checkSettled: the decodes that stayed still have every prefill's
// session, and every prefill is back to no transfer and no pinned slot
// in use.
func (m *mesh) checkSettled() {
	m.t.Helper()
	for d, inst := range m.dec {
		if d != victim {
			if s := inst.sc.stats().Sessions; s != meshSides {
				m.t.Errorf("%s has %d sessions, want %d: one was lost", inst.sc.name, s, meshSides)
			}
		}
	}
	for _, sc := range m.pre {
		deadline := time.Now().Add(10 * time.Second)
		for {
			st := sc.stats()
			if st.Transfers == 0 && st.SendInUse == 0 && st.RecvInUse == 0 {
				break
			}
			if time.Now().After(deadline) {
				m.t.Errorf("%s not idle: %d transfers, %d send slots, %d receive slots in use", sc.name, st.Transfers, st.SendInUse, st.RecvInUse)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func joinFirst(ss []string, n int) string {
	out := ""
	for i, s := range ss[:min(n, len(ss))] {
		if i > 0 {
			out += "\n"
		}
		out += s
	}
	return out
}
