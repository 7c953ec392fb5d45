package client

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
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
	spin    spin.Policy   // see WithSpin, WithAdaptiveSpin
	rwait   spin.Adaptive // the reader's window: readLoop's alone
	pieces  piecesConf    // see WithPieces (pieces.go)
	dues    dueBook       // the Do answers the reader foresees (due.go)
	kick    *spin.Kick    // wakes the reader to plan for a Do (nil: never)
	closing atomic.Bool   // Close has begun: the reader no longer sleeps in AwaitOr
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

// Region describes memory to register.
type Region struct {
	Name      string
	Handle    uint8 // device.HandleKind
	Access    wire.Access
	Ordinal   uint32
	AllocSize uint64 // size of the whole shared allocation
	Offset    uint64 // the region's offset inside it
	Length    uint64
	HandleRaw []byte // IPC handle bytes or export key
	FD        int    // memfd / POSIX fd sent with SCM_RIGHTS; -1 for none
}

// Register registers a region with the sidecar. The fd, if any, stays the
// caller's (the sidecar receives its own copy).
func (c *Client) Register(ctx context.Context, r Region) error {
	req := c.next()
	_, err := c.call(ctx, req, &wire.Register{Req: req, Name: r.Name, Handle: r.Handle, Access: r.Access, Ordinal: r.Ordinal,
		AllocSize: r.AllocSize, Offset: r.Offset, Length: r.Length, HandleRaw: r.HandleRaw}, r.FD)
	return err
}

// Join puts the connection into the group named by token, a secret the
// group's connections share (at least wire.MinGroup bytes, at most
// wire.MaxGroup): they may then use, unregister, check and cancel each
// other's regions, KV caches and transfers, and each subscriber hears of
// the group's transfers. It must be the connection's first request
// (PROTOCOL.md 9.18); without it a connection is a group of its own.
func (c *Client) Join(ctx context.Context, token []byte) error {
	req := c.next()
	_, err := c.call(ctx, req, &wire.Join{Req: req, Group: token}, -1)
	return err
}

// Unregister removes a region. Transfers still using it keep it mapped
// until they end; UnregisterWait says when the memory may be freed.
func (c *Client) Unregister(ctx context.Context, name string) error {
	req := c.next()
	_, err := c.call(ctx, req, &wire.Unregister{Req: req, Name: name}, -1)
	return err
}

// UnregisterWait removes a region and returns once the sidecar no longer
// uses its memory: no transfer holds it and, when it was the last region
// of its allocation, the sidecar closed its import. It waits up to wait
// (at least 1 ms; the sidecar caps it at 10 minutes) for the transfers
// holding the region; if they still do then, the error has code
// wire.CodeBusy and the region stays registered: retry later.
func (c *Client) UnregisterWait(ctx context.Context, name string, wait time.Duration) error {
	ms := max(wait.Milliseconds(), 1)
	if ms > math.MaxUint32 {
		ms = math.MaxUint32
	}
	req := c.next()
	_, err := c.call(ctx, req, &wire.Unregister{Req: req, Name: name, WaitMs: uint32(ms)}, -1)
	return err
}

// Transfer is a transfer to submit. Ops index LocalNames and RemoteNames.
type Transfer struct {
	Route string
	// Peer names the route's peer: its node name or host:port. Empty:
	// the route's only peer (or any, on a route with pick: any); a route
	// of several peers refuses a transfer that names none.
	Peer        string
	Dir         wire.Direction
	Tag         string
	Checksum    uint8 // wire.ChecksumRoute, ChecksumOn, ChecksumOff
	LocalNames  []string
	RemoteNames []string
	Ops         []wire.LocalOp
}

// Submit starts a transfer and returns its id.
func (c *Client) Submit(ctx context.Context, t Transfer) (uint64, error) {
	a, err := c.submit(ctx, t, false)
	if err != nil {
		return 0, err
	}
	s, ok := a.(*wire.Submitted)
	if !ok {
		return 0, fmt.Errorf("stage: Submit answered with %s", a.Type())
	}
	return s.Transfer, nil
}

// Wait waits for a transfer to finish (timeout 0: no limit besides ctx). A
// failed transfer returns its status and an *Error.
func (c *Client) Wait(ctx context.Context, id uint64, timeout time.Duration) (*wire.XferStatus, error) {
	req := c.next()
	a, err := c.call(ctx, req, &wire.Wait{Req: req, Transfer: id, TimeoutMs: uint32(timeout / time.Millisecond)}, -1)
	if err != nil {
		return nil, err
	}
	return statusResult(a)
}

// Status returns a transfer's state now.
func (c *Client) Status(ctx context.Context, id uint64) (*wire.XferStatus, error) {
	req := c.next()
	a, err := c.call(ctx, req, &wire.Status{Req: req, Transfer: id}, -1)
	if err != nil {
		return nil, err
	}
	return statusResult(a)
}

func statusResult(a wire.Msg) (*wire.XferStatus, error) {
	st, ok := a.(*wire.XferStatus)
	if !ok {
		return nil, fmt.Errorf("stage: expected a transfer status, got %s", a.Type())
	}
	if st.State == wire.StateFailed {
		return st, &Error{Code: st.Code, Msg: st.Message}
	}
	return st, nil
}

// Do submits a transfer and waits for it, in one request (SubmitWait): the
// sidecar answers when the transfer has finished. A failed transfer returns
// its status and an *Error; ctx ending stops the waiting, not the transfer.
func (c *Client) Do(ctx context.Context, t Transfer) (*wire.XferStatus, error) {
	a, err := c.submit(ctx, t, true)
	if err != nil {
		return nil, err
	}
	return statusResult(a)
}

// Cancel cancels a transfer.
func (c *Client) Cancel(ctx context.Context, id uint64) error {
	req := c.next()
	_, err := c.call(ctx, req, &wire.Cancel{Req: req, Transfer: id}, -1)
	return err
}

// Subscribe asks for notifications of transfers that finish on this side
// (peers' pushes that landed here, pulls served from here). The channel
// closes with the connection.
func (c *Client) Subscribe(ctx context.Context) (<-chan *wire.Notify, error) {
	req := c.next()
	if _, err := c.call(ctx, req, &wire.Subscribe{Req: req}, -1); err != nil {
		return nil, err
	}
	return c.notify, nil
}

func (c *Client) query(ctx context.Context, what uint8, arg string, v any) error {
	req := c.next()
	a, err := c.call(ctx, req, &wire.Query{Req: req, What: what, Arg: arg}, -1)
	if err != nil {
		return err
	}
	r, ok := a.(*wire.QueryReply)
	if !ok {
		return fmt.Errorf("stage: expected a query reply, got %s", a.Type())
	}
	return json.Unmarshal(r.JSON, v)
}

// Stats returns the sidecar's figures.
func (c *Client) Stats(ctx context.Context) (*wire.Stats, error) {
	var s wire.Stats
	return &s, c.query(ctx, wire.QueryStats, "", &s)
}

// Routes describes the sidecar's routes.
func (c *Client) Routes(ctx context.Context) ([]wire.RouteInfo, error) {
	var r []wire.RouteInfo
	return r, c.query(ctx, wire.QueryRoutes, "", &r)
}

// Regions lists the regions of this connection and its group (Join);
// other engines' are not listed.
func (c *Client) Regions(ctx context.Context) ([]wire.RegionInfo, error) {
	var r []wire.RegionInfo
	return r, c.query(ctx, wire.QueryRegions, "", &r)
}

// Catalog lists the regions a route's peer offers: route is the route's
// name, or "route@peer" (node name or host:port) on a route of several.
func (c *Client) Catalog(ctx context.Context, route string) ([]wire.RegionInfo, error) {
	var r []wire.RegionInfo
	return r, c.query(ctx, wire.QueryCatalog, route, &r)
}

// RegisterKV gives a KV layout to regions already registered: layers[l][t]
// names the region holding tensor t of layer l (docs/KVLAYOUT.md).
func (c *Client) RegisterKV(ctx context.Context, name string, layout wire.KVLayout, layers [][]string) error {
	req := c.next()
	_, err := c.call(ctx, req, &wire.RegisterKV{Req: req, Name: name, Layout: layout, Layers: layers}, -1)
	return err
}

// GrantKey is a new transfer key for Grant: 16 random bytes (128 bits),
// unguessable, to be used once.
func GrantKey() ([]byte, error) {
	k := make([]byte, wire.MinGrantKey)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("stage: making a transfer key: %w", err)
	}
	return k, nil
}

// Grant lets the peer request that names key read (write false: a pull,
// at most uses times) or write (write true: pushes, uses ignored) exactly
// the block table blocks of this connection's KV cache, for ttl (at most
// wire.MaxGrantTTLMs ms). The cache is guarded from then on: a peer
// request naming no live grant is refused. No blocks: only guard it.
func (c *Client) Grant(ctx context.Context, cache string, key []byte, write bool, blocks []uint32, ttl time.Duration, uses int) error {
	ms := ttl.Milliseconds()
	if ms < 1 || ms > wire.MaxGrantTTLMs {
		return fmt.Errorf("stage: grant of %v: want 1ms to %dms", ttl, wire.MaxGrantTTLMs)
	}
	if write {
		uses = 0
	} else if uses < 1 || uses > wire.MaxGrantUses {
		return fmt.Errorf("stage: read grant of %d uses: want 1 to %d", uses, wire.MaxGrantUses)
	}
	req := c.next()
	_, err := c.call(ctx, req, &wire.Grant{Req: req, Cache: cache, Key: key, Write: write, TTLMs: uint32(ms), Uses: uint16(uses), Blocks: blocks}, -1)
	return err
}

// RevokeGrant ends the grant key on cache (nothing if it ended already).
func (c *Client) RevokeGrant(ctx context.Context, cache string, key []byte) error {
	req := c.next()
	_, err := c.call(ctx, req, &wire.RevokeGrant{Req: req, Cache: cache, Key: key}, -1)
	return err
}

// SubmitKV starts a KV transfer (t.Req is set here) and returns its id.
func (c *Client) SubmitKV(ctx context.Context, t wire.SubmitKV) (uint64, error) {
	t.Req = c.next()
	a, err := c.call(ctx, t.Req, &t, -1)
	if err != nil {
		return 0, err
	}
	s, ok := a.(*wire.Submitted)
	if !ok {
		return 0, fmt.Errorf("stage: SubmitKV answered with %s", a.Type())
	}
	return s.Transfer, nil
}
