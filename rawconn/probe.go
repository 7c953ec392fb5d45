package rawconn

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/stage-kv/stage/internal/pagemap"
)

// Whether splice send pays depends on the machine, not only on the kernel:
// on the GPU hosts (Intel, KVM) it moved 36-40% more than writev through
// one loopback connection; on the 2-core CPU machine (AMD EPYC, same
// kernel) 25-35% less (BenchmarkSendSplice against BenchmarkSendWritev).
// So a sidecar asks the machine: ProbeSplice sends the same payloads both
// ways over loopback and reports how fast each went.

// SpliceProbe is what ProbeSplice measured, in bytes per second.
type SpliceProbe struct {
	Writev, Splice float64
}

// Faster reports whether splice moved at least as much as writev.
func (p SpliceProbe) Faster() bool { return p.Splice >= p.Writev }

func (p SpliceProbe) String() string {
	return fmt.Sprintf("writev %.2f GB/s, splice %.2f GB/s", p.Writev/1e9, p.Splice/1e9)
}

// probeSlots is how many payload buffers the probe rotates through: enough
// that a rewritten one's spliced pages have left loopback's socket buffers
// in practice (the probe's bytes are never checked, so a late rewrite could
// only cost accuracy, not correctness).
const probeSlots = 8

// ProbeSplice sends rounds x probeSlots payloads of size bytes over one
// loopback TCP connection by writev and by vmsplice+splice, alternating
// which goes first each round, after one untimed round that warms both
// up, and returns each way's throughput. Everything it
// makes (a listener, two sockets, a pipe, the buffers, one reader
// goroutine) is gone when it returns.
func ProbeSplice(size, rounds int) (SpliceProbe, error) {
	if size <= 0 || rounds <= 0 {
		return SpliceProbe{}, fmt.Errorf("splice probe: size %d and rounds %d must be positive", size, rounds)
	}
	rig, err := newProbeRig(size)
	if err != nil {
		return SpliceProbe{}, fmt.Errorf("splice probe: %w", err)
	}
	defer rig.close()
	var tw, ts time.Duration
	for r := -1; r < rounds; r++ { // round -1 warms both paths up, untimed
		// Alternate which goes first, so neither always meets a cold cache.
		order := []bool{r%2 != 0, r%2 == 0}
		for _, splice := range order {
			d, err := rig.pass(splice, byte(r))
			if err != nil {
				how := "writev"
				if splice {
					how = "splice"
				}
				return SpliceProbe{}, fmt.Errorf("splice probe: %s pass: %w", how, err)
			}
			switch {
			case r < 0:
			case splice:
				ts += d
			default:
				tw += d
			}
		}
	}
	bytes := float64(rounds) * float64(probeSlots) * float64(size)
	return SpliceProbe{Writev: bytes / tw.Seconds(), Splice: bytes / ts.Seconds()}, nil
}

// probeRig is what the probe's passes share: a loopback pair, probeSlots
// prefaulted buffers of size bytes (so the timed passes pay for no page
// fault), and a reader that drains exactly what each pass sends, then
// says so.
type probeRig struct {
	a, b     *Conn
	mem      []byte
	size, pg int
	stride   int
	head     []byte
	per      int64 // bytes a pass sends
	passes   chan int64
	drained  chan error
}

func newProbeRig(size int) (*probeRig, error) {
	a, b, err := loopbackPair(1)
	if err != nil {
		return nil, err
	}
	pg := os.Getpagesize()
	mem, err := pagemap.Map(probeSlots * ((size + pg - 1) / pg * pg))
	if err != nil {
		closePair(a, b, 1)
		return nil, fmt.Errorf("buffers: %w", err)
	}
	r := &probeRig{a: a, b: b, mem: mem, size: size, pg: pg, stride: len(mem) / probeSlots, head: make([]byte, 64),
		passes: make(chan int64), drained: make(chan error, 1)}
	r.per = int64(probeSlots) * int64(len(r.head)+size)
	go func() {
		buf := make([]byte, 1<<20)
		for left := range r.passes {
			var err error
			for left > 0 && err == nil {
				var n int
				n, err = b.Read(buf[:min(int64(len(buf)), left)])
				left -= int64(n)
			}
			r.drained <- err
		}
	}()
	return r, nil
}

// pass sends every buffer once, each page dirtied first with tag, by
// splice or by writev, and returns how long until the reader had it all.
func (r *probeRig) pass(splice bool, tag byte) (time.Duration, error) {
	r.passes <- r.per
	start := time.Now()
	for i := range probeSlots {
		p := r.mem[i*r.stride : i*r.stride+r.size]
		for j := 0; j < len(p); j += r.pg {
			p[j] = tag // dirty every page, as a gather refilling a slot does
		}
		var err error
		if splice {
			var refused error
			_, refused, err = r.a.WriteSplice(r.head, p)
			if err == nil && refused != nil {
				err = refused
			}
		} else {
			err = r.a.Writev([][]byte{r.head, p})
		}
		if err != nil {
			r.b.Shutdown() // wakes the reader out of its Read
			<-r.drained
			return 0, err
		}
	}
	if err := <-r.drained; err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// close stops the reader and frees the buffers and the pair.
func (r *probeRig) close() {
	close(r.passes)
	_ = pagemap.Unmap(r.mem)
	closePair(r.a, r.b, 1)
}

// loopbackPair connects two Conns over 127.0.0.1, each for users users.
func loopbackPair(users int) (a, b *Conn, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, fmt.Errorf("listen on loopback: %w", err)
	}
	defer ln.Close()
	got := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept() // nil when the dial failed and ln closed
		got <- c
	}()
	c1, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second)
	if err != nil {
		_ = ln.Close()
		if c := <-got; c != nil {
			_ = c.Close()
		}
		return nil, nil, fmt.Errorf("dial loopback: %w", err)
	}
	c2 := <-got
	if c2 == nil {
		_ = c1.Close()
		return nil, nil, errors.New("loopback accept failed")
	}
	if a, err = New(c1, users); err != nil {
		_ = c2.Close()
		return nil, nil, err
	}
	if b, err = New(c2, users); err != nil {
		closePair(a, nil, users)
		return nil, nil, err
	}
	return a, b, nil
}

// closePair shuts down a and b (either may be nil) and calls Done for
// each of their users.
func closePair(a, b *Conn, users int) {
	for _, c := range []*Conn{a, b} {
		if c == nil {
			continue
		}
		c.Shutdown()
		for range users {
			c.Done()
		}
	}
}
