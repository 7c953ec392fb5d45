package staging_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/hostmem"
	"github.com/stage-kv/stage/staging"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func openDev(t *testing.T) *hostmem.Dev {
	t.Helper()
	d, err := hostmem.Open(0, device.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return d.(*hostmem.Dev)
}

func TestCopierOrderAndRecovery(t *testing.T) {
	dev := openDev(t)
	mem, m := sharedMapping(t, dev, "copier", 1<<20)
	defer mem.Close()
	pool, err := staging.NewPool(dev, 64<<10, 4)
	if err != nil {
		t.Fatal(err)
	}
	c, err := staging.NewCopier(dev, 4)
	if err != nil {
		t.Fatal(err)
	}
	for i := range mem.Bytes() {
		mem.Bytes()[i] = byte(i * 7)
	}
	var mu sync.Mutex
	var order []int
	var errs []error
	var wg sync.WaitGroup
	gather := func(i int) {
		wg.Add(1)
		seg := []device.Seg{{Addr: m.Base() + device.Addr(i*4096), Len: 4096}}
		err := c.Gather(pool.Slot(i%4).Slice(0, 4096), seg, func(err error) {
			mu.Lock()
			order = append(order, i)
			errs = append(errs, err)
			mu.Unlock()
			wg.Done()
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 4; i++ {
		gather(i)
	}
	wg.Wait()
	for i, o := range order {
		if o != i || errs[i] != nil {
			t.Fatalf("callbacks %v errors %v, want 0..3 in order without errors", order, errs)
		}
	}
	if !bytes.Equal(pool.Slot(3).Host()[:4096], mem.Bytes()[3*4096:4*4096]) {
		t.Fatal("gathered bytes differ")
	}
	// The next copy fails; the one after it must work on a fresh stream.
	dev.FailAfter(0)
	order, errs = nil, nil
	gather(0)
	wg.Wait()
	if !errors.Is(errs[0], hostmem.ErrInjected) {
		t.Fatalf("got %v, want the injected failure", errs[0])
	}
	gather(1)
	wg.Wait()
	if errs[1] != nil {
		t.Fatalf("copy after a failure: %v, want success on a new stream", errs[1])
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestPoolBackpressure(t *testing.T) {
	dev := openDev(t)
	p, err := staging.NewPool(dev, 64<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := p.TryAcquire()
	b, _ := p.TryAcquire()
	if _, ok := p.TryAcquire(); ok {
		t.Fatal("acquired a third slot from a pool of two")
	}
	if p.InUse() != 2 {
		t.Fatalf("in use %d, want 2", p.InUse())
	}
	if err := p.Close(); err == nil {
		t.Fatal("closed a pool with slots in use")
	}
	p.Release(a)
	p.Release(b)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
}

// A renewable pool's slot reads zero after Renew and the pool frees its
// slab on Close (the device reports nothing left open).
func TestRenewablePool(t *testing.T) {
	dev := openDev(t)
	p, err := staging.NewRenewablePool(dev, 64<<10, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Renewable() {
		t.Fatal("pool from NewRenewablePool says it is not renewable")
	}
	for i := 0; i < p.Cap(); i++ {
		for j := range p.Slot(i).Host() {
			p.Slot(i).Host()[j] = 0xAB
		}
	}
	if err := p.Renew(1); err != nil {
		t.Fatal(err)
	}
	for i, want := range []byte{0xAB, 0, 0xAB} {
		if got := p.Slot(i).Host()[100]; got != want {
			t.Errorf("slot %d after renewing slot 1: byte %#x, want %#x", i, got, want)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	dev2 := openDev(t)
	defer dev2.Close()
	plain, err := staging.NewPool(dev2, 64<<10, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.Renew(0); err == nil {
		t.Fatal("renewed a slot of a plain pool")
	}
}

// TestPoolLastInFirstOut: the slot released last is handed out first (it is
// the one most likely still in the CPU caches), whatever the order of
// release.
func TestPoolLastInFirstOut(t *testing.T) {
	dev := openDev(t)
	defer dev.Close()
	p, err := staging.NewPool(dev, 64<<10, 4)
	if err != nil {
		t.Fatal(err)
	}
	var first []int
	for range 4 {
		i, _ := p.TryAcquire()
		first = append(first, i)
	}
	if want := []int{0, 1, 2, 3}; !slices.Equal(first, want) {
		t.Fatalf("a fresh pool handed out %v, want %v", first, want)
	}
	for _, tc := range []struct{ release, want []int }{
		{release: []int{2}, want: []int{2}},
		{release: []int{0, 3}, want: []int{3, 0}},
		{release: []int{1, 2, 0}, want: []int{0, 2, 1}},
	} {
		for _, i := range tc.release {
			p.Release(i)
		}
		var got []int
		for range tc.want {
			i, ok := p.TryAcquire()
			if !ok {
				t.Fatalf("released %v: no slot to acquire", tc.release)
			}
			got = append(got, i)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("released %v: acquired %v, want %v", tc.release, got, tc.want)
		}
	}
	for i := range 4 { // every case took back what it released
		p.Release(i)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPoolConcurrent: goroutines acquiring (waiting when none is free) and
// releasing never hold one slot twice, and every slot comes back.
func TestPoolConcurrent(t *testing.T) {
	dev := openDev(t)
	defer dev.Close()
	const slots, workers, rounds = 3, 8, 500
	p, err := staging.NewPool(dev, 64<<10, slots)
	if err != nil {
		t.Fatal(err)
	}
	var held [slots]atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				i, err := p.Acquire(context.Background())
				if err != nil {
					errs <- err
					return
				}
				if held[i].Add(1) != 1 {
					errs <- fmt.Errorf("slot %d handed out while held", i)
				}
				runtime.Gosched()
				held[i].Add(-1)
				p.Release(i)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := p.InUse(); n != 0 {
		t.Errorf("%d slots in use after every worker released its own", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range slots {
		if _, err := p.Acquire(ctx); err != nil {
			t.Fatalf("a free slot was not handed out: %v", err)
		}
	}
	if _, err := p.Acquire(ctx); err == nil {
		t.Fatal("acquired a slot from an empty pool with a cancelled context")
	}
}

// TestCopierAfterClose: every copy asked of a closed Copier is refused
// at once with device.ErrClosed, never left waiting for an event that
// Close already released (issue 35, item 6).
func TestCopierAfterClose(t *testing.T) {
	_, m, pool, c := copierRig(t, "copier-closed")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	slot := pool.Slot(0).Slice(0, 4096)
	segs := []device.Seg{{Addr: m.Base(), Len: 4096}}
	runs := []device.Run{{Addr: m.Base(), Len: 4096, N1: 1, N2: 1}}
	calls := map[string]func(func(error)) error{
		"Gather":      func(d func(error)) error { return c.Gather(slot, segs, d) },
		"Scatter":     func(d func(error)) error { return c.Scatter(segs, slot, d) },
		"GatherRuns":  func(d func(error)) error { return c.GatherRuns(slot, runs, d) },
		"ScatterRuns": func(d func(error)) error { return c.ScatterRuns(runs, slot, d) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			res := make(chan error, 1)
			go func() {
				res <- call(func(error) { t.Error("done ran for a refused copy") })
			}()
			select {
			case err := <-res:
				if !errors.Is(err, device.ErrClosed) {
					t.Fatalf("got %v, want device.ErrClosed", err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("copy on a closed Copier still blocked after 2s")
			}
		})
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
