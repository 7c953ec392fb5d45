package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/wire"
)

// Error is a failure the sidecar reported, with its code.
type Error struct {
	Code wire.Code
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("stage: %s: %s", e.Code, e.Msg) }

// CodeOf returns the sidecar's code for err, or CodeInternal.
func CodeOf(err error) wire.Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return wire.CodeInternal
}

// ErrClosed: the connection to the sidecar is gone.
var ErrClosed = errors.New("stage: connection to the sidecar closed")

// Client is a connection to one sidecar.
type Client struct {
	conn    *net.UnixConn
	wmu     sync.Mutex
	seq     atomic.Uint64
	mu      sync.Mutex
	pending map[uint64]chan wire.Msg
	notify  chan *wire.Notify
	err     error
	done    chan struct{}
	spin    spin.Policy    // see WithSpin, WithAdaptiveSpin
	rwait   spin.Adaptive  // the reader's window: readLoop's alone
	pieces  piecesConf     // see WithPieces (pieces.go)
	dues    dueBook        // the Do answers the reader foresees (due.go)
	kick    *spin.Kick     // wakes the reader to plan for a Do (nil: never)
	closing atomic.Bool    // Close has begun: the reader no longer sleeps in AwaitOr
	orphans sync.WaitGroup // Cancels of transfers started after their submit gave up (cancelOrphan)
}

// Option changes how a Client works.
type Option func(*Client)

// WithSpin makes the client poll for answers for up to d before its
// threads sleep: the reader polls the socket after each frame, and a
// caller polls for its answer before it blocks. A sleeping thread costs
// 5-10 us to wake on bare metal and 50 us or more on a virtual machine;
// for small pushes that is a large part of the latency. The price is a
// busy core (two while a call waits) for up to d at a time. 0 never
// polls. Without this option (or WithAdaptiveSpin) the client polls as
// WithAdaptiveSpin(100us, 1ms) does on machines of spin.MinCPUs (8) CPUs
// or more and never below, as the sidecar's staging.read_spin does by
// default.
func WithSpin(d time.Duration) Option { return func(c *Client) { c.spin = spin.Fixed(d) } }

// WithAdaptiveSpin is WithSpin with a window that follows the pace of the
// answers: the reader polls for base after each frame, and for up to
// limit when the frames it waited for came at a steady pace longer than
// base (each answer checked before the next call, say), so that it is
// still awake when the next one comes. When the waits grow past limit
// (the client idle) the window goes back to base; either way the reader
// polls once, for at most limit, after the last frame and then sleeps. A
// caller polls for its own answer for base. limit <= base is
// WithSpin(base); base <= 0 never polls.
func WithAdaptiveSpin(base, limit time.Duration) Option {
	return func(c *Client) { c.spin = spin.Policy{Base: max(base, 0), Max: max(limit, base, 0)} }
}

// Dial connects to the control socket at path.
func Dial(path string, opts ...Option) (*Client, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("stage: connect to sidecar at %s: %w; is staged running, and is this its control_socket?", path, err)
	}
	cl := &Client{conn: c, pending: map[uint64]chan wire.Msg{}, notify: make(chan *wire.Notify, 4096), done: make(chan struct{}),
		spin: spin.DefaultPolicy(), pieces: defaultPieces()}
	for _, o := range opts {
		o(cl)
	}
	if !cl.spin.Off() {
		// Without one the reader waits as if nothing were due.
		cl.kick, _ = spin.NewKick()
	}
	go cl.readLoop()
	return cl, nil
}

// Close closes the connection; calls in flight fail with ErrClosed.
func (c *Client) Close() error {
	if c.kick != nil {
		// A reader asleep in AwaitOr holds the socket, and closing it
		// waits for that: wake the reader first, and it then waits in
		// a plain read, which the close ends.
		c.closing.Store(true)
		c.kick.Wake()
	}
	err := c.conn.Close()
	<-c.done
	c.orphans.Wait() // each fails at once on the closed connection
	if c.kick != nil {
		_ = c.kick.Close() // the reader is gone; a Do's late Wake does nothing
	}
	return err
}

func (c *Client) readLoop() {
	defer close(c.done)
	var buf []byte
	var err error
	// Buffered, so a frame's header and body usually arrive in one read.
	r := bufio.NewReaderSize(c.conn, 64<<10)
	c.rwait = c.spin.New()
	for {
		var m wire.Msg
		if r.Buffered() == 0 {
			c.await()
		}
		_, m, buf, err = wire.ReadFrame(r, buf)
		if err != nil {
			break
		}
		if n, ok := m.(*wire.Notify); ok {
			select {
			case c.notify <- n:
			default: // subscriber not reading: drop rather than stall answers
			}
			continue
		}
		req := reqID(m)
		c.mu.Lock()
		ch := c.pending[req]
		delete(c.pending, req)
		c.mu.Unlock()
		if ch != nil {
			c.dues.answered(req)
			ch <- m
		} else if f, ok := m.(*wire.Fail); ok && req == 0 {
			err = &Error{Code: f.Code, Msg: f.Message}
			break
		} else if s, ok := m.(*wire.Submitted); ok {
			c.cancelOrphan(s.Transfer)
		}
	}
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		err = ErrClosed
	}
	c.mu.Lock()
	c.err = err
	for id, ch := range c.pending {
		close(ch)
		delete(c.pending, id)
	}
	c.mu.Unlock()
	close(c.notify)
}

// await waits until the connection has bytes to read: for an answer due
// (a Do of known pace, due.go) asleep until a little before it and polling
// through it, else polling the usual window and then asleep until bytes
// come or a Do wakes the reader to plan for its answer.
func (c *Client) await() {
	for {
		if sleep, poll := c.dues.next().Plan(time.Now()); poll > 0 {
			spin.AwaitDue(c.conn, sleep, poll)
			return
		}
		if c.kick == nil || c.closing.Load() {
			spin.Await(c.conn, &c.rwait)
			return
		}
		if !spin.AwaitOr(c.conn, &c.rwait, c.kick) {
			return
		}
	}
}

// orphanCancelWait bounds the Cancel of a transfer started after its
// submit gave up.
const orphanCancelWait = 5 * time.Second

// cancelOrphan cancels transfer id, whose Submitted came after its caller
// stopped waiting (its context ended): nobody follows it, and the caller
// may already have given its memory to something else, so it must not go
// on reading or writing there. Aside, since only the reader can take the
// Cancel's answer; Close waits for it.
func (c *Client) cancelOrphan(id uint64) {
	c.orphans.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), orphanCancelWait)
		defer cancel()
		_ = c.Cancel(ctx, id) // an error: it ended already, or the connection went; nothing left to stop
	})
}

func reqID(m wire.Msg) uint64 {
	switch m := m.(type) {
	case *wire.OK:
		return m.Req
	case *wire.Fail:
		return m.Req
	case *wire.Submitted:
		return m.Req
	case *wire.XferStatus:
		return m.Req
	case *wire.QueryReply:
		return m.Req
	case *wire.Tickets:
		return m.Req
	}
	return 0
}

// call sends a request (and fd, when >= 0) and waits for its answer.
func (c *Client) call(ctx context.Context, req uint64, m wire.Msg, fd int) (wire.Msg, error) {
	return c.callWith(ctx, req, m, func() error {
		var flags wire.Flags
		var oob []byte
		if fd >= 0 {
			flags = wire.FlagFD
			oob = unix.UnixRights(fd)
		}
		frame := wire.AppendFrame(nil, m, false, flags)
		if oob == nil {
			_, err := c.conn.Write(frame)
			return err
		}
		n, _, err := c.conn.WriteMsgUnix(frame, oob, nil)
		if err == nil && n < len(frame) {
			_, err = c.conn.Write(frame[n:])
		}
		return err
	})
}

// callWith sends request req, m or its pieces, with send (called with the
// connection's write lock held) and waits for its answer.
func (c *Client) callWith(ctx context.Context, req uint64, m wire.Msg, send func() error) (wire.Msg, error) {
	ch := make(chan wire.Msg, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.pending[req] = ch
	c.mu.Unlock()
	c.wmu.Lock()
	err := send()
	c.wmu.Unlock()
	if err != nil {
		c.mu.Lock()
		delete(c.pending, req)
		c.mu.Unlock()
		return nil, c.sendErr(m, err)
	}
	if c.spin.Base > 0 {
		// Poll for the answer before blocking: the reader hands it over
		// without having to wake this goroutine's thread.
		deadline := time.Now().Add(c.spin.Base)
		for i := 0; ; i++ {
			select {
			case a, ok := <-ch:
				return c.answer(a, ok)
			default:
			}
			if ctx.Err() != nil || (i%64 == 0 && time.Now().After(deadline)) {
				break
			}
			runtime.Gosched()
		}
	}
	select {
	case a, ok := <-ch:
		return c.answer(a, ok)
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, req)
		c.mu.Unlock()
		return nil, ctx.Err()
	}
}

// refusalWait bounds how long a failed send waits for the reader to take
// the sidecar's reason for closing the connection.
const refusalWait = 500 * time.Millisecond

// sendErr is the error of a send that failed. A sidecar that refuses a
// connection (limits.max_clients reached, no request in
// limits.client_first_request_timeout) says why in a Fail with Req 0
// before it closes it, so a send that fails on the closed socket reports
// that reason (an *Error) rather than a bare broken pipe.
func (c *Client) sendErr(m wire.Msg, err error) error {
	t := time.NewTimer(refusalWait)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
	}
	c.mu.Lock()
	cerr := c.err
	c.mu.Unlock()
	var se *Error
	if errors.As(cerr, &se) {
		return fmt.Errorf("stage: send %s: the sidecar closed the connection: %w", m.Type(), cerr)
	}
	return fmt.Errorf("stage: send %s: %w", m.Type(), err)
}

// answer turns what the reader handed a call into its result.
func (c *Client) answer(a wire.Msg, ok bool) (wire.Msg, error) {
	if !ok {
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	if f, ok := a.(*wire.Fail); ok {
		return nil, &Error{Code: f.Code, Msg: f.Message}
	}
	return a, nil
}

func (c *Client) next() uint64 { return c.seq.Add(1) }
