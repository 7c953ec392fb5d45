package netns

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// The load tests run with STAGE_LOAD=1 (`make load`): 17 sidecars are a
// lot for a small CI machine.
func requireLoad(t *testing.T) {
	t.Helper()
	if os.Getenv("STAGE_LOAD") != "1" && os.Getenv(labEnv) == "" {
		t.Skip("skipped: set STAGE_LOAD=1 (make load) for the fan-in and fan-out runs")
	}
}

const (
	fanPeers = 16
	// Each flow: loadLayers workers, each pushing layers of loadLayer
	// bytes, loadRounds times.
	loadLayers = 2
	loadLayer  = 4 << 20
	loadRounds = 24
	// The busy side's staging: 64 slots of 1 MiB.
	loadSlots = 64
	loadSlot  = 1 << 20
)

// memWatch samples a process's private anonymous memory (RssAnon: Go
// heap and stacks; the pinned pool and the engines' regions are shared
// memory, RssShmem) until stopped.
type memWatch struct {
	pid       int
	idle      uint64
	mu        sync.Mutex
	peakAnon  uint64
	peakShmem uint64
	stop      chan struct{}
	done      chan error
}

func watchMem(pid int) (*memWatch, error) {
	m := &memWatch{pid: pid, stop: make(chan struct{}), done: make(chan error, 1)}
	anon, _, err := procRss(pid)
	if err != nil {
		return nil, err
	}
	m.idle = anon
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-m.stop:
				m.done <- nil
				return
			case <-tick.C:
			}
			anon, shmem, err := procRss(pid)
			if err != nil {
				m.done <- err
				return
			}
			m.mu.Lock()
			m.peakAnon, m.peakShmem = max(m.peakAnon, anon), max(m.peakShmem, shmem)
			m.mu.Unlock()
		}
	}()
	return m, nil
}

func (m *memWatch) finish() error {
	close(m.stop)
	return <-m.done
}

// procRss reads RssAnon and RssShmem of a process.
func procRss(pid int) (anon, shmem uint64, err error) {
	m, err := procStatus(pid)
	if err != nil {
		return 0, 0, err
	}
	return m["RssAnon"], m["RssShmem"], nil
}

// flows runs every flow at once and returns each one's throughput in
// bytes per second.
func flows(t *testing.T, ps []*pushes) []float64 {
	t.Helper()
	rates := make([]float64, len(ps))
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t0 := time.Now()
			errs[i] = p.run(context.Background(), loadLayers*loadRounds)
			rates[i] = float64(p.bytes) / time.Since(t0).Seconds()
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("flow %d: %v", i, err)
		}
	}
	return rates
}

// fairness logs every flow's rate and fails when the fastest is more than
// 1.5 times the slowest.
func fairness(t *testing.T, what string, rates []float64) {
	t.Helper()
	lo, hi, sum := rates[0], rates[0], 0.0
	var b strings.Builder
	for i, r := range rates {
		lo, hi, sum = min(lo, r), max(hi, r), sum+r
		fmt.Fprintf(&b, " %d:%.0f", i, r/1e6)
	}
	t.Logf("%s: MB/s per flow:%s; total %.0f MB/s; fastest/slowest %.2f", what, b.String(), sum/1e6, hi/lo)
	if hi > 1.5*lo {
		t.Errorf("%s: the fastest flow moved %.2fx the slowest's rate, want at most 1.5x", what, hi/lo)
	}
}

// memBound logs the busy side's memory and fails when its private memory
// grew by more than its staging pool: bytes must go through the pinned
// pool, not pile up on the heap.
func memBound(t *testing.T, who string, m *memWatch, moved uint64) {
	t.Helper()
	if err := m.finish(); err != nil {
		t.Fatal(err)
	}
	pool := uint64(loadSlots * loadSlot)
	grew := m.peakAnon - min(m.peakAnon, m.idle)
	t.Logf("%s: moved %d MiB; pinned pool %d MiB; private memory idle %d MiB, peak %d MiB (+%d MiB); shared memory peak %d MiB (pool + mapped regions)",
		who, moved>>20, pool>>20, m.idle>>20, m.peakAnon>>20, grew>>20, m.peakShmem>>20)
	if grew > pool {
		t.Errorf("%s: private memory grew by %d MiB, more than the %d MiB staging pool", who, grew>>20, pool>>20)
	}
}

// measure runs the flows at once, watching the busy sidecar's memory,
// then checks every flow, the memory bound and the fairness.
func measure(t *testing.T, what, who string, busy *sidecar, ps []*pushes) {
	t.Helper()
	m, err := watchMem(busy.pid())
	if err != nil {
		t.Fatal(err)
	}
	rates := flows(t, ps)
	var moved uint64
	for _, p := range ps {
		p.check()
		moved += p.bytes
	}
	memBound(t, who, m, moved)
	fairness(t, what, rates)
}

// TestFanIn: 16 senders, each in its own namespace, push to one receiver
// at once. Every transfer lands verified, the senders' rates are within
// 1.5x of each other, and the receiver's private memory stays within its
// staging pool.
func TestFanIn(t *testing.T) {
	requireLoad(t)
	l := inLab(t, fanPeers+1)
	if l == nil {
		return
	}
	busy := spec{name: "sink", slotSize: "1MiB", slots: loadSlots, extraYAML: "limits:\n  max_sessions: 64\n"}
	dec := startSidecar(t, l, fanPeers, busy)
	var ps []*pushes
	for i := 0; i < fanPeers; i++ {
		name := fmt.Sprintf("src%d", i)
		pre := startSidecar(t, l, i, spec{name: name, routes: []route{{name: "sink", peer: dec.addr(), progress: 60 * time.Second}}})
		pre.waitSessions(1, 15*time.Second)
		ps = append(ps, newPushes(t, name, pre, dec, "sink", loadLayers, loadLayer))
	}
	dec.waitSessions(fanPeers, 15*time.Second)
	measure(t, "fan-in", "receiver", dec, ps)
}

// TestFanOut: one sender pushes to 16 receivers, each in its own
// namespace, at once, on one route each. Every transfer lands verified,
// the routes' rates are within 1.5x of each other, and the sender's
// private memory stays within its staging pool.
func TestFanOut(t *testing.T) {
	requireLoad(t)
	l := inLab(t, fanPeers+1)
	if l == nil {
		return
	}
	var decs []*sidecar
	busy := spec{name: "source", slotSize: "1MiB", slots: loadSlots}
	for i := 0; i < fanPeers; i++ {
		dec := startSidecar(t, l, i+1, spec{name: fmt.Sprintf("dst%d", i)})
		decs = append(decs, dec)
		busy.routes = append(busy.routes, route{name: dec.name, peer: dec.addr(), progress: 60 * time.Second})
	}
	pre := startSidecar(t, l, 0, busy)
	pre.waitSessions(fanPeers, 15*time.Second)
	var ps []*pushes
	for _, dec := range decs {
		ps = append(ps, newPushes(t, "to-"+dec.name, pre, dec, dec.name, loadLayers, loadLayer))
	}
	measure(t, "fan-out", "sender", pre, ps)
}
