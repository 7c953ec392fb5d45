package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// listenLocal creates the control socket: its directory 0700, the socket
// 0600, so only the engine's user can talk to the sidecar.
func listenLocal(path string) (*net.UnixListener, error) {
	if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
		_ = c.Close()
		return nil, fmt.Errorf("control socket %s: another staged is serving it; stop it or set control_socket", path)
	}
	_ = os.Remove(path) // a stale socket of a sidecar that died
	ln, err := unixsock.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return ln, nil
}

// client is one engine connection on the control socket.
type client struct {
	s     *Server
	conn  *net.UnixConn
	raw   syscall.RawConn
	out   chan *bytebufferpool.ByteBuffer
	wg    sync.WaitGroup
	once  sync.Once
	dead  chan struct{}
	waits sync.WaitGroup

	// A small answer goes straight out from whoever produced it when the
	// writer has nothing in hand (wmu guards pending, the answers queued
	// or being written by writeLoop), so answers stay in order and the
	// latency path saves a goroutine hand-off.
	wmu     sync.Mutex
	pending int
}

// directMax is the largest answer written straight from the producer.
const directMax = 64 << 10

// clientQueue bounds answers and notifications queued for one client; a
// client that lets it fill is not reading and is disconnected.
const clientQueue = 8192

func (s *Server) acceptLocal() {
	defer s.wg.Done()
	for {
		c, err := s.localLn.AcceptUnix()
		if err != nil {
			if s.closing.Load() {
				return
			}
			s.log.Warn("accept on control socket", zap.Error(err))
			time.Sleep(50 * time.Millisecond)
			continue
		}
		s.mu.Lock()
		if len(s.clients) >= s.cfg.Limits.MaxClients {
			s.mu.Unlock()
			_ = c.Close()
			s.log.Warn("control socket: limits.max_clients reached; refused a connection", zap.Int("max", s.cfg.Limits.MaxClients))
			continue
		}
		raw, err := c.SyscallConn()
		if err != nil {
			s.mu.Unlock()
			_ = c.Close()
			s.log.Warn("control socket: connection without a file descriptor", zap.Error(err))
			continue
		}
		cl := &client{s: s, conn: c, raw: raw, out: make(chan *bytebufferpool.ByteBuffer, clientQueue), dead: make(chan struct{})}
		s.clients[cl] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(2)
		cl.wg.Add(2)
		go cl.writeLoop()
		go cl.readLoop()
	}
}

func (c *client) close() {
	c.once.Do(func() {
		close(c.dead)
		_ = c.conn.Close()
		c.s.mu.Lock()
		delete(c.s.clients, c)
		delete(c.s.subs, c)
		c.s.mu.Unlock()
	})
}

// reply sends or queues a message for the client; it never blocks.
func (c *client) reply(m wire.Msg) {
	buf := bytebufferpool.Get()
	buf.B = wire.AppendFrame(buf.B[:0], m, false, 0)
	c.wmu.Lock()
	if c.pending == 0 && len(buf.B) <= directMax {
		n := c.tryWrite(buf.B)
		if n == len(buf.B) {
			c.wmu.Unlock()
			bytebufferpool.Put(buf)
			return
		}
		buf.B = append(buf.B[:0], buf.B[n:]...) // the writer sends the rest
	}
	c.pending++
	c.wmu.Unlock()
	select {
	case <-c.dead:
		bytebufferpool.Put(buf)
	case c.out <- buf:
	default:
		bytebufferpool.Put(buf)
		c.s.log.Error("control client is not reading its answers; disconnecting it")
		c.close()
	}
}

// tryWrite sends what of b the socket takes now, without blocking; a
// failed socket takes nothing (the writer meets the error).
func (c *client) tryWrite(b []byte) int {
	var n int
	if err := c.raw.Write(func(fd uintptr) bool {
		for {
			k, err := unix.SendmsgN(int(fd), b, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
			if err == unix.EINTR {
				continue
			}
			if err == nil {
				n = k
			}
			return true
		}
	}); err != nil {
		return 0
	}
	return n
}

func (c *client) fail(req uint64, err error) {
	c.reply(&wire.Fail{Req: req, Code: errCode(err), Message: err.Error()})
}

func (c *client) writeLoop() {
	defer c.s.wg.Done()
	defer c.wg.Done()
	for {
		select {
		case <-c.dead:
			for {
				select {
				case b := <-c.out:
					bytebufferpool.Put(b)
				default:
					return
				}
			}
		case b := <-c.out:
			_, err := c.conn.Write(b.B)
			bytebufferpool.Put(b)
			c.wmu.Lock()
			c.pending--
			c.wmu.Unlock()
			if err != nil {
				c.close()
			}
		}
	}
}

func (c *client) readLoop() {
	defer c.s.wg.Done()
	defer c.wg.Done()
	defer c.waits.Wait()
	defer c.close()
	var buf []byte
	for {
		var (
			m   wire.Msg
			fd  int
			err error
		)
		spin.Readable(c.conn, c.s.cfg.Staging.ReadSpin)
		_, m, fd, buf, err = unixsock.ReadFrame(c.conn, buf)
		var bad *unixsock.BadRequest
		if errors.As(err, &bad) && bad.Req != 0 {
			code := wire.CodeMalformed
			if errors.Is(bad.Err, wire.ErrOverflow) {
				code = wire.CodeOutOfRange
			}
			c.reply(&wire.Fail{Req: bad.Req, Code: code, Message: bad.Err.Error()})
			continue
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.s.log.Warn("control client sent a bad frame; disconnecting it", zap.Error(err))
				c.reply(&wire.Fail{Code: wire.CodeMalformed, Message: err.Error()})
				time.Sleep(10 * time.Millisecond) // let the answer go out
			}
			return
		}
		c.handle(m, fd)
	}
}

func (c *client) handle(m wire.Msg, fd int) {
	s := c.s
	switch m := m.(type) {
	case *wire.Register:
		err := s.register0(m, fd)
		unixsock.CloseFD(fd) // the import keeps what it needs
		if err != nil {
			c.fail(m.Req, err)
			return
		}
		c.reply(&wire.OK{Req: m.Req})
		return
	case *wire.RegisterKV:
		if err := s.registerKV(m); err != nil {
			c.fail(m.Req, err)
		} else {
			c.reply(&wire.OK{Req: m.Req})
		}
	case *wire.SubmitKV:
		// The first KV transfer to a peer's cache waits for its shape (one
		// round trip): answered aside, so the client's other requests go on.
		c.waits.Add(1)
		go func() {
			defer c.waits.Done()
			t0 := time.Now()
			lx, err := s.submitKV(s.ctx, m)
			if err == nil {
				s.metrics.kvAccepts.Add(1)
				s.metrics.kvAcceptN.Add(uint64(time.Since(t0)))
			}
			if err != nil {
				c.fail(m.Req, err)
				return
			}
			c.reply(&wire.Submitted{Req: m.Req, Transfer: lx.id})
		}()
	case *wire.Unregister:
		if err := s.regions.Unregister(m.Name); err != nil {
			c.fail(m.Req, err)
		} else {
			c.reply(&wire.OK{Req: m.Req})
		}
	case *wire.Submit:
		lx, err := s.submit(s.ctx, m)
		if err != nil {
			c.fail(m.Req, err)
			return
		}
		c.reply(&wire.Submitted{Req: m.Req, Transfer: lx.id})
	case *wire.SubmitWait:
		lx, err := s.submit(s.ctx, &m.Submit)
		if err != nil {
			c.fail(m.Req, err)
			return
		}
		// Answered from whoever finishes the transfer; reply never blocks.
		req := m.Req
		lx.whenDone(func() { c.reply(lx.status(req)) })
	case *wire.Status:
		lx, err := s.lookupXfer(m.Transfer)
		if err != nil {
			c.fail(m.Req, err)
			return
		}
		c.reply(lx.status(m.Req))
	case *wire.Wait:
		lx, err := s.lookupXfer(m.Transfer)
		if err != nil {
			c.fail(m.Req, err)
			return
		}
		c.waits.Add(1)
		go func() {
			defer c.waits.Done()
			var timeout <-chan time.Time
			if m.TimeoutMs > 0 {
				t := time.NewTimer(time.Duration(m.TimeoutMs) * time.Millisecond)
				defer t.Stop()
				timeout = t.C
			}
			select {
			case <-lx.done:
			case <-timeout:
			case <-c.dead:
				return
			}
			c.reply(lx.status(m.Req))
		}()
	case *wire.Cancel:
		if err := s.cancelXfer(m.Transfer); err != nil {
			c.fail(m.Req, err)
		} else {
			c.reply(&wire.OK{Req: m.Req})
		}
	case *wire.Subscribe:
		s.mu.Lock()
		s.subs[c] = struct{}{}
		s.mu.Unlock()
		c.reply(&wire.OK{Req: m.Req})
	case *wire.Query:
		answer := func() {
			js, err := s.query(m)
			if err != nil {
				c.fail(m.Req, err)
				return
			}
			c.reply(&wire.QueryReply{Req: m.Req, JSON: js})
		}
		if m.What != wire.QueryCatalog {
			answer()
			break
		}
		// A catalog waits for the peer: answer it aside so the client's
		// other requests are not held up.
		c.waits.Add(1)
		go func() {
			defer c.waits.Done()
			answer()
		}()
	default:
		unixsock.CloseFD(fd)
		c.fail(reqOf(m), codeErr(wire.CodeBadRequest, "%s is not a request", m.Type()))
		return
	}
	unixsock.CloseFD(fd)
}

// reqOf finds the request id of any local message (they all start with it).
func reqOf(m wire.Msg) uint64 {
	b := m.AppendBody(nil)
	if len(b) >= 8 {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// register0 validates a Register and imports the memory.
func (s *Server) register0(m *wire.Register, fd int) error {
	if m.Name == "" {
		return codeErr(wire.CodeBadRequest, "region name is empty")
	}
	if m.Access == 0 || m.Access&^wire.AccessAll != 0 {
		return codeErr(wire.CodeBadRequest, "region %q: access bits %#x: grant at least one of local-read, local-write, remote-write, remote-read", m.Name, m.Access)
	}
	if int(m.Ordinal) != s.dev.Ordinal() {
		return codeErr(wire.CodeBadRequest, "region %q is on device %d; this sidecar serves %s", m.Name, m.Ordinal, s.dev)
	}
	hk := device.HandleKind(m.Handle)
	if hk == device.HandleHostAddr {
		return codeErr(wire.CodeAccessDenied, "region %q: raw addresses cannot be registered through the control socket", m.Name)
	}
	needFD := hk == device.HandleMemfd || hk == device.HandlePosixFD
	if needFD && fd < 0 {
		return codeErr(wire.CodeBadRequest, "region %q: a %s handle needs its fd sent with the frame (SCM_RIGHTS)", m.Name, hk)
	}
	h := device.Handle{Kind: hk, Bytes: m.HandleRaw, FD: fd, Size: m.AllocSize}
	return s.regions.Register(m.Name, h, m.Access, m.Offset, m.Length)
}

// notify tells every subscriber about a transfer that finished here.
func (s *Server) notify(n *wire.Notify) {
	s.mu.Lock()
	subs := make([]*client, 0, len(s.subs))
	for c := range s.subs {
		subs = append(subs, c)
	}
	s.mu.Unlock()
	for _, c := range subs {
		c.reply(n)
	}
}
