package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Pre-authentication bounds of the flood test's receiver.
const (
	floodMax     = 16
	floodPerAddr = 4
	floodTimeout = 2 * time.Second
)

// TestPreauthFlood (issue 16, items 6 and 7): thousands of connections
// that never say a word, from three source addresses at once (loopback
// has every 127.x address), take at most limits.max_handshakes_per_addr
// places each: the receiver's file descriptors stay bounded, a legitimate
// peer still connects while the flood goes on, the refusals are counted in
// stage_preauth_refused_total, and the log grows by a few sampled lines,
// not one per connection. A flood from many addresses meets the total
// bound. A silent connection is closed after limits.handshake_timeout
// (2s here; the default is 10s). Before, each connection kept a goroutine
// and a descriptor until a fixed 10s timeout and wrote a WARN line.
func TestPreauthFlood(t *testing.T) {
	dec := startNode(t, "decode", nodeOpts{extra: fmt.Sprintf("metrics:\n  listen: 127.0.0.1:0\nlimits:\n  max_handshakes: %d\n  max_handshakes_per_addr: %d\n  handshake_timeout: %s\n",
		floodMax, floodPerAddr, floodTimeout)})
	pid := dec.cmd.Process.Pid
	baseFDs := countFDs(t, pid)
	logBefore := countLines(t, dec.log)

	silentFor := make(chan time.Duration, 1)
	go func() { silentFor <- timeToClose(t, "127.0.0.1", dec.peers) }()

	ctx, stop := context.WithCancel(context.Background())
	var opened atomic.Int64
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			flood(ctx, fmt.Sprintf("127.0.0.%d", 2+i), dec.peers, &opened)
		}()
	}
	var maxFDs atomic.Int64
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ctx.Err() == nil {
			maxFDs.Store(max(maxFDs.Load(), int64(countFDs(t, pid))))
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(time.Second) // the flood is on before the legitimate peer dials
	pre := startNode(t, "prefill", nodeOpts{route: "decode", peer: dec.peers})
	pre.settle(1)
	dec.settle(1)
	for opened.Load() < 2000 {
		time.Sleep(50 * time.Millisecond)
	}
	// Many addresses, each below its own bound: the total bound holds.
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holdSilent(ctx, fmt.Sprintf("127.0.1.%d", 1+i), dec.peers, floodPerAddr, &opened)
		}()
	}
	time.Sleep(500 * time.Millisecond)
	stop()
	wg.Wait()
	<-watched

	// The legitimate session: 1 control connection and 2 data streams, and
	// the prefill's and the scraper's connections come and go.
	if limit := int64(baseFDs + floodMax + 3 + 8); maxFDs.Load() > limit {
		t.Errorf("the receiver had up to %d file descriptors during the flood (%d before it), want at most %d", maxFDs.Load(), baseFDs, limit)
	}
	n := opened.Load()
	if grown := countLines(t, dec.log) - logBefore; int64(grown) > n/10 {
		t.Errorf("the receiver's log grew by %d lines for %d connections; want far fewer (sampled)", grown, n)
	}
	_, body := scrape(t, dec.metrics, "/metrics")
	perAddr, _ := metricValue(body, `stage_preauth_refused_total{reason="per_addr"}`)
	total, _ := metricValue(body, `stage_preauth_refused_total{reason="total"}`)
	if perAddr < float64(n)/2 || total < 1 {
		t.Errorf("stage_preauth_refused_total: per_addr %v, total %v after %d connections; want most refused per address and some by the total", perAddr, total, n)
	}
	if d := <-silentFor; d < floodTimeout-200*time.Millisecond || d > floodTimeout+2*time.Second {
		t.Errorf("a silent connection was closed after %v, want about limits.handshake_timeout (%v)", d, floodTimeout)
	}
	t.Logf("%d connections; up to %d fds (base %d); refused per_addr %v, total %v", n, maxFDs.Load(), baseFDs, perAddr, total)
}

// flood opens connections from src to addr that never send a byte, as
// fast as a few hundred per second, until ctx ends; it keeps the last
// few hundred open.
func flood(ctx context.Context, src, addr string, opened *atomic.Int64) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: time.Second}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	for ctx.Err() == nil {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		opened.Add(1)
		held = append(held, c)
		if len(held) > 300 {
			_ = held[0].Close()
			held = held[1:]
		}
		time.Sleep(time.Millisecond)
	}
}

// holdSilent opens n silent connections from src and holds them until
// ctx ends.
func holdSilent(ctx context.Context, src, addr string, n int, opened *atomic.Int64) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: time.Second}
	for range n {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			continue
		}
		opened.Add(1)
		defer c.Close()
	}
	<-ctx.Done()
}

// timeToClose opens a silent connection from src and says how long the
// receiver took to close it.
func timeToClose(t *testing.T, src, addr string) time.Duration {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Errorf("dial %s: %v", addr, err)
		return 0
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(15 * time.Second))
	_, _ = io.Copy(io.Discard, c) // until the receiver closes it (or the deadline)
	return time.Since(start)
}

func countFDs(t *testing.T, pid int) int {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Errorf("read the fds of %d: %v", pid, err)
		return 0
	}
	return len(ents)
}

func countLines(t *testing.T, path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return bytes.Count(b, []byte{'\n'})
}
