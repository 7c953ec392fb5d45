package staging_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stage-kv/stage/staging"
)

// Receive slots are shared fairly (fair.go): a lone tenant takes the pool
// less the reserve, a newcomer gets the reserve at once, and a slot that
// comes back goes to the tenant under its share while the one over it
// keeps waiting.
func TestPoolFairShares(t *testing.T) {
	dev := openDev(t)
	p, err := staging.NewPool(dev, 4096, 32)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var a, b staging.Tenant
	var held []int
	for i := 0; i < 30; i++ {
		s, err := p.AcquireAs(ctx, &a)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if _, err := p.AcquireAs(short, &a); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a lone tenant took slot 31 of 32 (err %v); the reserve is 2", err)
	}
	cancel()
	bs := make([]int, 0, 2)
	for i := 0; i < 2; i++ {
		s, err := p.AcquireAs(ctx, &b)
		if err != nil {
			t.Fatalf("the newcomer waited for a reserve slot: %v", err)
		}
		bs = append(bs, s)
	}
	// Both wait now; a's slots come back one by one: each goes to b
	// (2 of a share of 16) and a keeps waiting.
	type got struct {
		who  string
		slot int
	}
	ch := make(chan got, 64)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for wctx.Err() == nil {
			s, err := p.AcquireAs(wctx, &a)
			if err != nil {
				return
			}
			ch <- got{"a", s}
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < 14; i++ {
			s, err := p.AcquireAs(wctx, &b)
			if err != nil {
				return
			}
			ch <- got{"b", s}
		}
	}()
	time.Sleep(20 * time.Millisecond) // both are waiting
	for i := 0; i < 14; i++ {
		p.ReleaseAs(held[0], &a)
		held = held[1:]
		select {
		case g := <-ch:
			if g.who != "b" {
				t.Fatalf("slot %d given back went to %s (over its share), not to b (under it)", i, g.who)
			}
			bs = append(bs, g.slot)
		case <-time.After(5 * time.Second):
			t.Fatalf("slot %d given back went to nobody", i)
		}
	}
	stop()
	wg.Wait()
	for _, s := range held {
		p.ReleaseAs(s, &a)
	}
	for _, s := range bs {
		p.ReleaseAs(s, &b)
	}
	for len(ch) > 0 { // taken as stop came
		g := <-ch
		p.ReleaseAs(g.slot, map[string]*staging.Tenant{"a": &a, "b": &b}[g.who])
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
}
