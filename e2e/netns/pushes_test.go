package netns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// guard is the byte destination memory holds before anything lands.
const guard = 0xAB

// pushes moves verified transfers from src to dst over one route (or,
// made by newPulls, pulls dst's bytes into src). Worker w owns layer w of
// both caches: before transfer i it fills the source layer with bytes of
// its own (seeded by i), moves them to a random permutation of the
// destination layer's blocks, and on success checks that the peer (dst)
// notified it exactly once and that every byte landed. A failed attempt
// is retried (same bytes, new tag) when its code is one a fault may
// cause.
type pushes struct {
	t         *testing.T
	name      string
	src, dst  *sidecar // src's engine submits; dst is its route's peer
	route     string
	dir       wire.Direction
	S, D      *kvsim.Cache // registered on src and on dst
	block     uint64
	attempts  int           // per transfer, before giving up
	hang      time.Duration // an attempt with no answer by then hung
	book      *noteBook
	mayFailAs map[wire.Code]bool

	mu     sync.Mutex
	done   int
	failed map[string]int // failed attempts by code
	tags   []string       // tags of failed attempts
	bytes  uint64
}

// newPushes makes the caches (layers x layerBytes), registers them and
// subscribes to dst's notifications.
func newPushes(t *testing.T, name string, src, dst *sidecar, route string, layers int, layerBytes uint64) *pushes {
	t.Helper()
	p := &pushes{t: t, name: name, src: src, dst: dst, route: route, dir: wire.Push, block: 16 << 10, attempts: 30, hang: 60 * time.Second,
		mayFailAs: map[wire.Code]bool{wire.CodePeerUnavailable: true, wire.CodeTimeout: true}, failed: map[string]int{}}
	var err error
	if p.S, err = kvsim.New(name+"-src", layers, layerBytes, 8192); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.S.Close() })
	if p.D, err = kvsim.New(name+"-dst", layers, layerBytes, 8192); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.D.Close() })
	if err := p.D.Poison(guard); err != nil {
		t.Fatal(err)
	}
	p.attachSrc()
	p.attachDst()
	return p
}

// newPulls is newPushes for pulls: src's engine pulls dst's cache D into
// its own cache S, which starts poisoned.
func newPulls(t *testing.T, name string, src, dst *sidecar, route string, layers int, layerBytes uint64) *pushes {
	t.Helper()
	p := newPushes(t, name, src, dst, route, layers, layerBytes)
	p.dir = wire.Pull
	if err := p.S.Poison(guard); err != nil {
		t.Fatal(err)
	}
	return p
}

// data returns the cache the bytes come from and the one they land in.
func (p *pushes) data() (from, to *kvsim.Cache) {
	if p.dir == wire.Pull {
		return p.D, p.S
	}
	return p.S, p.D
}

// verify checks that ms landed, and the guard bytes around them held.
func (p *pushes) verify(ms []kvsim.Move) error {
	from, to := p.data()
	return kvsim.Verify(from, to, ms, guard)
}

// transfer is the engine's request for ms, tagged tag.
func (p *pushes) transfer(tag string, ms []kvsim.Move) client.Transfer {
	return kvsim.Transfer(p.route, p.dir, tag, p.S, p.D, ms)
}

// attachSrc registers the local cache on src (again, after a restart).
func (p *pushes) attachSrc() {
	p.t.Helper()
	if err := p.S.Register(context.Background(), p.src.cl, wire.AccessAll); err != nil {
		p.t.Fatalf("register %s on %s: %v", p.S.Name, p.src.name, err)
	}
}

// attachDst registers the destination cache on dst (again, after a
// restart) and listens to its notifications.
func (p *pushes) attachDst() {
	p.t.Helper()
	if err := p.D.Register(context.Background(), p.dst.cl, wire.AccessAll); err != nil {
		p.t.Fatalf("register %s on %s: %v", p.D.Name, p.dst.name, err)
	}
	p.book = p.dst.notes()
}

// fillLayer writes bytes seeded by seed over one layer of c.
func fillLayer(c *kvsim.Cache, layer int, seed uint64) error {
	r := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	b := make([]byte, c.LayerBytes)
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	if err := c.Memory().WriteAt(b, c.Guard+uint64(layer)*c.LayerBytes); err != nil {
		return fmt.Errorf("fill layer %d of %s: %w", layer, c.Name, err)
	}
	return nil
}

// one moves transfer i on layer w, retrying attempts that failed cleanly.
func (p *pushes) one(ctx context.Context, w, i int) error {
	seed := uint64(i)*0x9e3779b9 + 1
	from, _ := p.data()
	if err := fillLayer(from, w, seed); err != nil {
		return err
	}
	ms := kvsim.ByLayer(p.S, kvsim.Blocks(p.S, p.block, seed))[w]
	for a := 1; ; a++ {
		tag := fmt.Sprintf("%s-%d.%d", p.name, i, a)
		err := p.attempt(ctx, tag, ms)
		if err == nil {
			p.mu.Lock()
			p.done++
			p.bytes += kvsim.Bytes(ms)
			p.mu.Unlock()
			return nil
		}
		var fe *faultErr
		if !errors.As(err, &fe) {
			return err
		}
		p.mu.Lock()
		p.failed[fe.code.String()]++
		p.tags = append(p.tags, tag)
		p.mu.Unlock()
		if a == p.attempts {
			return fmt.Errorf("%s: transfer %d still failing after %d attempts: %w", p.name, i, a, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: transfer %d: %w", p.name, i, ctx.Err())
		case <-time.After(time.Duration(min(a, 10)) * 50 * time.Millisecond):
		}
	}
}

// faultErr is a failure a fault may cause: the transfer is tried again.
type faultErr struct {
	code wire.Code
	err  error
}

func (e *faultErr) Error() string { return e.err.Error() }

// attempt moves ms once. nil: done, notified once, every byte verified; a
// *faultErr: failed cleanly; any other error: the test fails.
func (p *pushes) attempt(ctx context.Context, tag string, ms []kvsim.Move) error {
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, p.hang)
	defer cancel()
	_, err := p.src.cl.Do(actx, p.transfer(tag, ms))
	// The run's own end: when it comes before the hang limit, the
	// attempt's timer (set to the same instant) may fire a hair before
	// the run's, so ctx.Err() alone can still be nil here.
	runEnded := ctx.Err() != nil
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		runEnded = true
	}
	switch {
	case err == nil:
	case runEnded:
		return fmt.Errorf("%s: %w", tag, context.DeadlineExceeded)
	case actx.Err() != nil && time.Since(start) >= p.hang:
		return fmt.Errorf("%s: no answer within %v: the transfer hung", tag, p.hang)
	case p.mayFailAs[client.CodeOf(err)]:
		return &faultErr{code: client.CodeOf(err), err: fmt.Errorf("%s: %w", tag, err)}
	default:
		return fmt.Errorf("%s failed with an error no fault here explains: %w", tag, err)
	}
	n, ok := p.book.wait(tag, 15*time.Second)
	if !ok {
		return fmt.Errorf("%s: the sender says done, the receiver never notified it", tag)
	}
	if n.Code != wire.CodeOK {
		return fmt.Errorf("%s: the sender says done, the receiver says %s: %s", tag, n.Code, n.Message)
	}
	if err := p.verify(ms); err != nil {
		return fmt.Errorf("%s reported done, but: %w", tag, err)
	}
	return nil
}

// run moves n transfers with one worker per layer; the first error stops
// them all and is returned.
func (p *pushes) run(ctx context.Context, n int) error { return p.runRange(ctx, 0, n) }

// runRange is run for transfers from..to-1 (their indices name them).
func (p *pushes) runRange(ctx context.Context, from, to int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, p.S.Layers)
	for w := 0; w < p.S.Layers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := from + w; i < to; i += p.S.Layers {
				if err := p.one(ctx, w, i); err != nil {
					errs <- err
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// check fails the test on duplicate notifications, and reports the
// figures.
func (p *pushes) check() {
	p.t.Helper()
	if d := p.book.duplicates(); len(d) > 0 {
		p.t.Errorf("%s: the receiver notified %d tags more than once: %v", p.name, len(d), d[:min(len(d), 5)])
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	landed := 0
	for _, tag := range p.tags {
		if n := p.book.get(tag); n != nil && n.Code == wire.CodeOK {
			landed++
		}
	}
	var codes []string
	for c, k := range p.failed {
		codes = append(codes, fmt.Sprintf("%s=%d", c, k))
	}
	sort.Strings(codes)
	p.t.Logf("%s: %d transfers done and verified (%d MiB); %d failed attempts retried [%s], of which the receiver had landed %d",
		p.name, p.done, p.bytes>>20, len(p.tags), strings.Join(codes, " "), landed)
}

// noteBook records a sidecar's notifications by tag.
type noteBook struct {
	mu      sync.Mutex
	seen    map[string]*wire.Notify
	waiters map[string]chan *wire.Notify
	dups    []string
}

// watch subscribes to cl's notifications until its connection closes.
func watch(t *testing.T, cl *client.Client) *noteBook {
	t.Helper()
	notes, err := cl.Subscribe(context.Background())
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	b := &noteBook{seen: map[string]*wire.Notify{}, waiters: map[string]chan *wire.Notify{}}
	go func() {
		for n := range notes {
			b.add(n)
		}
	}()
	return b
}

func (b *noteBook) add(n *wire.Notify) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, dup := b.seen[n.Tag]; dup {
		b.dups = append(b.dups, n.Tag)
		return
	}
	b.seen[n.Tag] = n
	if w := b.waiters[n.Tag]; w != nil {
		w <- n
		delete(b.waiters, n.Tag)
	}
}

func (b *noteBook) get(tag string) *wire.Notify {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seen[tag]
}

// wait returns tag's notification, waiting up to d for it.
func (b *noteBook) wait(tag string, d time.Duration) (*wire.Notify, bool) {
	b.mu.Lock()
	if n := b.seen[tag]; n != nil {
		b.mu.Unlock()
		return n, true
	}
	w := make(chan *wire.Notify, 1)
	b.waiters[tag] = w
	b.mu.Unlock()
	select {
	case n := <-w:
		return n, true
	case <-time.After(d):
		b.mu.Lock()
		delete(b.waiters, tag)
		b.mu.Unlock()
		return nil, false
	}
}

func (b *noteBook) duplicates() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.dups...)
}
