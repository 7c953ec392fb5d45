package proxytest_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/proxytest"
	"github.com/stage-kv/stage/wire"
)

// BenchmarkInlinePush4KiB times one 4 KiB push on the latency path (one
// data stream, no polling), engine to engine, both sidecars in this
// process: allocs/op counts the client's and both sidecars' allocations.
func BenchmarkInlinePush4KiB(b *testing.B) {
	pre, dec := proxytest.Pair(b, proxytest.Options{Stripes: 1, Configure: func(_ string, c *config.Config) {
		c.Staging.ReadSpin = 0
	}})
	mk := func(sc *proxytest.Sidecar, name string, access wire.Access) *kvsim.Cache {
		c, err := kvsim.New(name, 1, 1<<20, 4096)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		if err := c.Register(context.Background(), sc.Client, access); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Unregister(context.Background(), sc.Client) })
		return c
	}
	src := mk(pre, "src", wire.AccessLocalRead)
	dst := mk(dec, "dst", wire.AccessRemoteWrite)
	t := kvsim.Transfer(proxytest.Route, wire.Push, "t", src, dst, []kvsim.Move{{Len: 4096}})
	ctx := context.Background()
	do := func() {
		st, err := pre.Client.Do(ctx, t)
		if err != nil {
			b.Fatal(err)
		}
		if st.State != wire.StateDone {
			b.Fatalf("state %v", st.State)
		}
	}
	for range 300 {
		do()
	}
	b.ReportAllocs()
	c0 := cpuTime()
	b.ResetTimer()
	for range b.N {
		do()
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-c0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// cpuTime is the CPU time this process used (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
