package netns

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stage-kv/stage/internal/dnstest"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

const (
	// meshSides is how many prefills there are, and how many decodes.
	meshSides = 4
	// meshWorkers is how many pushes each prefill has in flight at once.
	meshWorkers = 2
	// meshSlot is one request's bytes: request i of prefill p writes slot
	// p*n+i of the region "kv/0" that every decode registers, so every
	// request owns a slot of its own on every decode.
	meshSlot = 4096
	// meshDNS is the name the prefills' route resolves to the decodes.
	meshDNS = "decode.stage.test"
	// victim is the decode that is killed and replaced mid-run.
	victim = 2
	// meshHang: a push with no answer by then hung.
	meshHang = 30 * time.Second
	// meshFailWithin: a push to the victim while it is gone must fail
	// within this (connect_timeout is 3s).
	meshFailWithin = 8 * time.Second
)

// Phases of the victim's replacement, in order; a push records the
// phase it started in and the one it ended in.
const (
	phaseUp      int32 = iota // every decode up
	phaseKilling              // SIGKILL on its way to the victim
	phaseKilled               // the victim is dead; DNS no longer names it
	phaseGone                 // every prefill's route has dropped it
	phaseBack                 // a new victim runs at a new address, in DNS
	phaseFound                // every prefill's route has it up
)

var phaseNames = []string{"up", "killing", "killed", "gone", "back", "found"}

// decodeInst is one decode process and the cache its engine registered.
type decodeInst struct {
	sc *sidecar
	kv *kvsim.Cache
}

// mesh is meshSides prefills whose route "decode" takes its peers from
// meshDNS, and meshSides decodes behind that name, each in a namespace of
// its own (decodes 0..3, prefills 4..7; the victim's replacement in 8).
type mesh struct {
	t    *testing.T
	l    *lab
	dns  *dnstest.Server
	n    int // pushes per prefill
	pre  []*sidecar
	src  [][]byte // each prefill's source layer, as filled
	srcC []*kvsim.Cache

	mu                    sync.Mutex
	dec                   [meshSides]*decodeInst // the instance a push names now
	insts                 []*decodeInst          // every instance ever started, the old victim included
	phase                 atomic.Int32
	done                  atomic.Int64 // pushes finished
	parked                atomic.Int32 // workers waiting for phaseFound, or finished
	goneCh, foundCh, stop chan struct{}
	res                   [meshSides][]result
	marks                 [phaseFound + 1]time.Time
}

// result is what became of one push.
type result struct {
	to          int // decode index
	inst        *decodeInst
	peer        string
	from, ended int32 // phases
	start, end  time.Time
	err         error
	attempted   bool
}

// TestPeersByDNS (issue 19, "Done when"): 4 prefills push to 4 decodes
// found through a real DNS server, each push to a decode chosen at random
// and named by node name or address; every push's bytes land in the named
// decode's region and nowhere else, checked byte for byte on every decode.
// Mid-run decode-2 is SIGKILLed and replaced under the same DNS name at a
// new address: pushes to it fail cleanly (an error within seconds, no
// bytes anywhere) while it is gone and land in the new one after, while
// no push to the other decodes fails. STAGE_PEER_PUSHES sets the pushes
// per prefill (default 200).
func TestPeersByDNS(t *testing.T) {
	l := inLab(t, 2*meshSides+1)
	if l == nil {
		return
	}
	m := newMesh(t, l, envInt(t, "STAGE_PEER_PUSHES", 200))
	start := time.Now()
	var wg sync.WaitGroup
	for p := range meshSides {
		var next atomic.Int32
		for range meshWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer m.parked.Add(1)
				r := rand.New(rand.NewPCG(uint64(p), uint64(time.Now().UnixNano())))
				for i := int(next.Add(1) - 1); i < m.n; i = int(next.Add(1) - 1) {
					if !m.gate(i) {
						return
					}
					m.res[p][i] = m.push(p, i, r)
					m.done.Add(1)
				}
			}()
		}
	}
	m.replaceVictim()
	wg.Wait()
	t.Logf("%d pushes from %d prefills in %v; phases: %s", meshSides*m.n, meshSides, time.Since(start).Round(time.Millisecond), m.timeline(start))
	m.checkResults()
	m.checkRegions()
	m.checkSettled()
}

// newMesh starts the DNS server, the decodes and the prefills, and waits
// until every prefill's route has every decode up.
func newMesh(t *testing.T, l *lab, n int) *mesh {
	t.Helper()
	if n < 8 {
		t.Fatalf("STAGE_PEER_PUSHES=%d: want at least 8", n)
	}
	dns, err := dnstest.Start(net.JoinHostPort(l.HubIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dns.Close)
	m := &mesh{t: t, l: l, dns: dns, n: n, goneCh: make(chan struct{}), foundCh: make(chan struct{}), stop: make(chan struct{})}
	t.Cleanup(func() { close(m.stop) })
	for d := range meshSides {
		m.dec[d] = m.startDecode(d, d)
	}
	m.publish()
	route := fmt.Sprintf("routes:\n  - name: decode\n    dns: %s:%d\n    dns_interval: 200ms\n    dns_server: %s\n"+
		"    stripes: 1\n    connect_timeout: 3s\n    progress_timeout: 10s\n", meshDNS, peerPort, dns.Addr())
	for p := range meshSides {
		sc := startSidecar(t, l, meshSides+p, spec{name: fmt.Sprintf("prefill-%d", p), slots: 8, extraYAML: route})
		c, err := kvsim.New("src", 1, uint64(n)*meshSlot, meshSlot)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if err := fillLayer(c, 0, uint64(p)+1); err != nil {
			t.Fatal(err)
		}
		if err := c.Register(context.Background(), sc.cl, wire.AccessAll); err != nil {
			t.Fatal(err)
		}
		b, err := c.ReadLayer(0)
		if err != nil {
			t.Fatal(err)
		}
		m.pre, m.srcC, m.src = append(m.pre, sc), append(m.srcC, c), append(m.src, b)
		m.res[p] = make([]result, n)
	}
	m.waitRoutes("every decode up", func(ps map[string]wire.PeerInfo) bool {
		for _, d := range m.dec {
			if p := ps[d.sc.addr()]; p.State != "up" || p.Node != d.sc.name || p.Found != "dns" {
				return false
			}
		}
		return len(ps) == meshSides
	})
	return m
}

// startDecode runs decode d in the lab's namespace ns with a poisoned
// cache "kv" of one slot per push of every prefill.
func (m *mesh) startDecode(d, ns int) *decodeInst {
	m.t.Helper()
	sc := startSidecar(m.t, m.l, ns, spec{name: fmt.Sprintf("decode-%d", d), slots: 8})
	kv, err := kvsim.New("kv", 1, uint64(meshSides*m.n)*meshSlot, meshSlot)
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { _ = kv.Close() })
	if err := kv.Poison(guard); err != nil {
		m.t.Fatal(err)
	}
	if err := kv.Register(context.Background(), sc.cl, wire.AccessAll); err != nil {
		m.t.Fatal(err)
	}
	inst := &decodeInst{sc: sc, kv: kv}
	m.mu.Lock()
	m.insts = append(m.insts, inst)
	m.mu.Unlock()
	return inst
}

// publish makes meshDNS answer with the current decodes' addresses.
func (m *mesh) publish(skip ...int) {
	var ips []string
	for d, inst := range m.dec {
		if len(skip) == 0 || skip[0] != d {
			ips = append(ips, inst.sc.ip)
		}
	}
	m.dns.Set(meshDNS, ips...)
}

// gate holds push i until the run is far enough: the second half waits
// until every route has dropped the killed victim (so pushes run while it
// is gone), the last quarter until the replacement is found. false: the
// test is over.
func (m *mesh) gate(i int) bool {
	if i >= m.n/2 {
		select {
		case <-m.goneCh:
		case <-m.stop:
			return false
		}
	}
	if i >= 3*m.n/4 {
		m.parked.Add(1)
		defer m.parked.Add(-1)
		select {
		case <-m.foundCh:
		case <-m.stop:
			return false
		}
	}
	return true
}

// push makes push i of prefill p: slot i of its source layer to slot
// p*n+i of a decode chosen at random, named by node name or address.
func (m *mesh) push(p, i int, r *rand.Rand) result {
	to := r.IntN(meshSides)
	m.mu.Lock()
	inst := m.dec[to]
	m.mu.Unlock()
	peer := inst.sc.name
	if r.IntN(2) == 0 {
		peer = inst.sc.addr()
	}
	tr := kvsim.Transfer("decode", wire.Push, fmt.Sprintf("p%d-%d", p, i), m.srcC[p], inst.kv,
		[]kvsim.Move{{Layer: 0, SrcOff: uint64(i) * meshSlot, DstOff: uint64(p*m.n+i) * meshSlot, Len: meshSlot}})
	tr.Peer = peer
	ctx, cancel := context.WithTimeout(context.Background(), meshHang)
	defer cancel()
	res := result{to: to, inst: inst, peer: peer, from: m.phase.Load(), start: time.Now(), attempted: true}
	_, res.err = m.pre[p].cl.Do(ctx, tr)
	res.end, res.ended = time.Now(), m.phase.Load()
	return res
}

// enter moves the run to phase ph.
func (m *mesh) enter(ph int32) {
	m.marks[ph] = time.Now()
	m.phase.Store(ph)
}

// replaceVictim kills the victim once a quarter of the pushes are done,
// takes it out of DNS, waits until every route dropped it and the pushes
// that were let through meanwhile are done, then starts a new victim in
// another namespace (a new address), puts it in DNS and waits until every
// route has it up.
func (m *mesh) replaceVictim() {
	m.t.Helper()
	m.marks[phaseUp] = time.Now()
	for m.done.Load() < int64(meshSides*m.n/4) {
		time.Sleep(5 * time.Millisecond)
	}
	old := m.dec[victim]
	m.enter(phaseKilling)
	old.sc.kill()
	m.enter(phaseKilled)
	m.publish(victim)
	m.waitRoutes("the killed decode dropped", func(ps map[string]wire.PeerInfo) bool {
		_, there := ps[old.sc.addr()]
		return !there && len(ps) == meshSides-1
	})
	m.enter(phaseGone)
	close(m.goneCh)
	for deadline := time.Now().Add(meshHang + 10*time.Second); m.parked.Load() < meshSides*meshWorkers; {
		if time.Now().After(deadline) {
			m.t.Fatalf("pushes while decode-%d is gone did not finish", victim)
		}
		time.Sleep(5 * time.Millisecond)
	}
	inst := m.startDecode(victim, 2*meshSides)
	m.mu.Lock()
	m.dec[victim] = inst
	m.mu.Unlock()
	m.enter(phaseBack)
	m.publish()
	m.waitRoutes("the new decode up", func(ps map[string]wire.PeerInfo) bool {
		p := ps[inst.sc.addr()]
		return p.State == "up" && p.Node == inst.sc.name && len(ps) == meshSides
	})
	m.enter(phaseFound)
	close(m.foundCh)
}

// waitRoutes waits until ok holds of route decode's peers (by address) on
// every prefill.
func (m *mesh) waitRoutes(what string, ok func(map[string]wire.PeerInfo) bool) {
	m.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, sc := range m.pre {
		for {
			rs, err := sc.cl.Routes(context.Background())
			if err != nil {
				m.t.Fatalf("%s routes: %v", sc.name, err)
			}
			ps := map[string]wire.PeerInfo{}
			for _, r := range rs {
				for _, p := range r.Peers {
					ps[p.Addr] = p
				}
			}
			if ok(ps) {
				break
			}
			if time.Now().After(deadline) {
				m.t.Fatalf("%s: %s: peers %+v\n%s", what, sc.name, ps, sc.tail())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// timeline says when each phase began, from start.
func (m *mesh) timeline(start time.Time) string {
	var b strings.Builder
	for ph, at := range m.marks {
		if !at.IsZero() {
			fmt.Fprintf(&b, "%s +%v ", phaseNames[ph], at.Sub(start).Round(time.Millisecond))
		}
	}
	return strings.TrimSpace(b.String())
}
