package main

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/rawconn"
)

// sender is one connection's sending end in one mode.
type sender interface {
	// send writes head (may be empty) then payload, which is ring slot
	// slot's memory.
	send(slot int, head, payload []byte) error
	// finish waits for what the kernel still owes (zerocopy completions).
	finish() error
	// shutdown wakes a blocked send (another side failed).
	shutdown()
	// close releases the socket once the sender's goroutine is out.
	close()
}

// pairs are the run's connections and memory; close releases them all.
type pairs struct {
	send  []sender
	recv  []*rawconn.Conn
	sring [][]byte
	rring [][]byte
}

func (p *pairs) close() {
	for _, s := range p.send {
		s.close()
	}
	for _, r := range p.recv {
		r.Done()
	}
	for _, b := range append(p.sring, p.rring...) {
		_ = unix.Munmap(b)
	}
}

// shutdown wakes every blocked call of the run.
func (p *pairs) shutdown() {
	for _, s := range p.send {
		s.shutdown()
	}
	for _, r := range p.recv {
		r.Shutdown()
	}
}

// run moves o.total bytes on each of o.conns loopback connections.
func run(o options) (Result, error) {
	if err := o.check(); err != nil {
		return Result{}, err
	}
	p, err := connect(o)
	if err != nil {
		return Result{}, err
	}
	defer p.close()
	return measure(o, p)
}

// connect makes o.conns connected pairs in o.mode and their touched rings.
func connect(o options) (p *pairs, err error) {
	p = &pairs{}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return p, fmt.Errorf("listen on loopback: %w", err)
	}
	defer ln.Close()
	for i := 0; i < o.conns; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return p, fmt.Errorf("connection %d: dial %s: %w", i, ln.Addr(), err)
		}
		a, err := ln.Accept()
		if err != nil {
			c.Close()
			return p, fmt.Errorf("connection %d: accept: %w", i, err)
		}
		if err := setBuffers(o.sndbuf, c, a); err != nil {
			c.Close()
			a.Close()
			return p, fmt.Errorf("connection %d: %w", i, err)
		}
		rc, err := rawconn.New(a, 1)
		if err != nil {
			c.Close()
			a.Close()
			return p, fmt.Errorf("connection %d: receiver in blocking mode: %w", i, err)
		}
		rc.SetSpin(spin.Fixed(o.spin))
		p.recv = append(p.recv, rc)
		s, err := newSenderFn(o, c)
		if err != nil {
			return p, fmt.Errorf("connection %d: %s sender: %w", i, o.mode, err)
		}
		p.send = append(p.send, s)
	}
	for i := 0; i < 2*o.conns; i++ {
		b, err := touched(o.ring, byte(i))
		if err != nil {
			return p, err
		}
		if i%2 == 0 {
			p.sring = append(p.sring, b)
		} else {
			p.rring = append(p.rring, b)
		}
	}
	return p, nil
}

// setBuffers sets SO_SNDBUF and SO_RCVBUF of every conn to b, as stage's
// staging.socket_buffer does; 0 leaves the kernel's autotuning.
func setBuffers(b int, conns ...net.Conn) error {
	if b == 0 {
		return nil
	}
	for _, c := range conns {
		tc := c.(*net.TCPConn)
		if err := tc.SetWriteBuffer(b); err != nil {
			return fmt.Errorf("SO_SNDBUF %d: %w", b, err)
		}
		if err := tc.SetReadBuffer(b); err != nil {
			return fmt.Errorf("SO_RCVBUF %d: %w", b, err)
		}
	}
	return nil
}

// touched maps n bytes of anonymous memory and writes every byte of it,
// so no page fault lands in the timed part.
func touched(n int, fill byte) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %d B ring: %w", n, err)
	}
	for i := range b {
		b[i] = fill + byte(i)
	}
	return b, nil
}

// newSenderFn is newSender; a test wraps it to fail a send.
var newSenderFn = newSender

// newSender makes c's sending end for o.mode; c is taken over.
func newSender(o options, c net.Conn) (sender, error) {
	switch o.mode {
	case "net":
		return &netSender{c: c}, nil
	case "zerocopy":
		return newZCSender(c, o.ring/o.chunk)
	}
	rc, err := rawconn.New(c, 1)
	if err != nil {
		c.Close()
		return nil, err
	}
	if o.mode == "splice" {
		if err := rc.PrepareSplice(o.chunk); err != nil {
			rc.Done()
			return nil, err
		}
	}
	return &rawSender{rc: rc, splice: o.mode == "splice"}, nil
}

// netSender writes through net.Conn (Go's netpoller).
type netSender struct{ c net.Conn }

func (s *netSender) send(_ int, head, payload []byte) error {
	if len(head) == 0 {
		_, err := s.c.Write(payload)
		return err
	}
	bufs := net.Buffers{head, payload}
	_, err := bufs.WriteTo(s.c)
	return err
}
func (s *netSender) finish() error { return nil }
func (s *netSender) shutdown()     { _ = s.c.Close() }
func (s *netSender) close()        { _ = s.c.Close() }

// rawSender writes with rawconn: blocking writev, or WriteSplice.
type rawSender struct {
	rc     *rawconn.Conn
	splice bool
	iov    [2][]byte
}

func (s *rawSender) send(_ int, head, payload []byte) error {
	if s.splice {
		_, refused, err := s.rc.WriteSplice(head, payload)
		if refused != nil {
			return fmt.Errorf("vmsplice refused the ring, the rest went by writev: %w", refused)
		}
		return err
	}
	s.iov[0], s.iov[1] = head, payload
	if len(head) == 0 {
		return s.rc.Writev(s.iov[1:])
	}
	return s.rc.Writev(s.iov[:])
}
func (s *rawSender) finish() error { return nil }
func (s *rawSender) shutdown()     { s.rc.Shutdown() }
func (s *rawSender) close()        { s.rc.Done() }

// side is what one goroutine measured.
type side struct {
	bytes int64
	cpu   float64
	end   time.Time
	err   error
}

// measure runs every sender and receiver at once and derives the result.
func measure(o options, p *pairs) (Result, error) {
	var ready, wg sync.WaitGroup
	start := make(chan struct{})
	sends := make([]side, o.conns)
	recvs := make([]side, o.conns)
	var once sync.Once
	abort := func() { once.Do(p.shutdown) }
	head := make([]byte, o.head)
	for i := 0; i < o.conns; i++ {
		ready.Add(2)
		wg.Add(2)
		go timed(o.lock, &ready, &wg, start, &sends[i], abort, func() (int64, error) { return sendLoop(o, p.send[i], p.sring[i], head) })
		go timed(o.lock, &ready, &wg, start, &recvs[i], abort, func() (int64, error) { return recvLoop(o, p.recv[i], p.rring[i]) })
	}
	ready.Wait()
	proc0, perr := rusageCPU(unix.RUSAGE_SELF)
	host0, herr := readHostStat()
	if err := errors.Join(perr, herr); err != nil {
		abort()
		close(start)
		wg.Wait()
		return Result{}, err
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	proc1, perr := rusageCPU(unix.RUSAGE_SELF)
	host1, herr := readHostStat()
	hostCPU, hostSoft := host1.since(host0)
	r := raw{procCPU: proc1 - proc0, hostCPU: hostCPU, hostSoft: hostSoft,
		conns: o.conns, total: o.total, chunk: int64(o.chunk), ring: int64(o.ring), sndbuf: int64(o.sndbuf), head: int64(o.head), mode: o.mode, locked: o.lock, spin: o.spin}
	errs := []error{perr, herr}
	for i := range sends {
		s, v := sends[i], recvs[i]
		errs = append(errs, wrap("sender", i, s.err), wrap("receiver", i, v.err))
		r.sent += s.bytes
		r.received += v.bytes
		r.sendCPU, r.recvCPU = addCPU(r.sendCPU, s.cpu, i), addCPU(r.recvCPU, v.cpu, i)
		r.seconds = max(r.seconds, v.end.Sub(t0).Seconds(), s.end.Sub(t0).Seconds())
		if z, ok := p.send[i].(*zcSender); ok {
			r.zcSends += z.completions
			r.zcCopied += z.copied
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Result{}, err
	}
	if r.sent != r.received || r.sent != o.total*int64(o.conns) {
		return Result{}, fmt.Errorf("sent %d B, received %d B, want %d B", r.sent, r.received, o.total*int64(o.conns))
	}
	return summarize(r), nil
}

// addCPU adds the CPU of connection i's side to sum; -1 (not measured)
// stays -1.
func addCPU(sum, cpu float64, i int) float64 {
	if cpu < 0 || (i > 0 && sum < 0) {
		return -1
	}
	return sum + cpu
}

// wrap names the connection of a failed side.
func wrap(what string, i int, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s %d: %w", what, i, err)
}

// timed runs body once start closes and records its bytes, end time and,
// on a locked thread, its thread's CPU in out (-1 unlocked); a failure
// wakes the others.
func timed(lock bool, ready, wg *sync.WaitGroup, start <-chan struct{}, out *side, abort func(), body func() (int64, error)) {
	defer wg.Done()
	if lock {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	ready.Done()
	<-start
	cpu := func() (float64, error) { return -1, nil }
	if lock {
		cpu = func() (float64, error) { return rusageCPU(unix.RUSAGE_THREAD) }
	}
	c0, err := cpu()
	if err == nil {
		out.bytes, err = body()
	}
	out.end = time.Now()
	c1, cerr := cpu()
	out.cpu, out.err = c1-c0, errors.Join(err, cerr)
	if !lock {
		out.cpu = -1
	}
	if out.err != nil {
		abort()
	}
}

// sendLoop writes o.total bytes from ring, slot after slot.
func sendLoop(o options, s sender, ring, head []byte) (int64, error) {
	slots := len(ring) / o.chunk
	sent := int64(0)
	for k := 0; sent < o.total; k++ {
		n := min(int64(o.chunk), o.total-sent)
		slot := k % slots
		if err := s.send(slot, head, ring[slot*o.chunk:slot*o.chunk+int(n)]); err != nil {
			return sent, fmt.Errorf("send %d B at %d: %w", n, sent, err)
		}
		sent += n
	}
	return sent, s.finish()
}

// recvLoop reads o.total bytes into ring, slot after slot, each after
// its head.
func recvLoop(o options, rc *rawconn.Conn, ring []byte) (int64, error) {
	slots := len(ring) / o.chunk
	head := make([]byte, o.head)
	got := int64(0)
	for k := 0; got < o.total; k++ {
		if err := rc.ReadFull(head); err != nil {
			return got, fmt.Errorf("read head at %d: %w", got, err)
		}
		n := min(int64(o.chunk), o.total-got)
		slot := k % slots
		if err := rc.ReadFull(ring[slot*o.chunk : slot*o.chunk+int(n)]); err != nil {
			return got, fmt.Errorf("read %d B at %d: %w", n, got, err)
		}
		got += n
	}
	return got, nil
}
