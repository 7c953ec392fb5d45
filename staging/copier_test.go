package staging_test

import (
	"bytes"
	"errors"
	"sync"
	"testing"

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
	mem, err := hostmem.NewShared("copier", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	m, err := dev.Import(mem.Handle())
	if err != nil {
		t.Fatal(err)
	}
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
