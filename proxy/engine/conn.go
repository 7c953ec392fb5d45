// Package engine serves the control socket: one connection per inference
// engine, each a reader goroutine (the only place fds arrive, by
// SCM_RIGHTS) and a writer fed by a bounded queue, with small answers
// written at once by whoever produced them when that queue is empty. What
// a request does is the Backend's business: the sidecar implements it.
// Each connection is an Owner, a group of its own until its first request
// joins one (Join); every request names it, Notify reaches the groups it
// is given, and the Backend hears when a connection ended (Closed).
package engine

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/bytebufferpool"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/internal/spin"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/proxy/unixsock"
	"github.com/stage-kv/stage/wire"
)

// client is one engine connection on the control socket.
type client struct {
	l     *Listener
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

	// owner is the connection and its group: set when the reader starts,
	// changed only by Join (its first request), under l.mu (Notify reads
	// the group there). started: a request other than Join came (reader
	// only).
	owner   Owner
	started bool

	pieces pieces // requests sent in pieces (conn_pieces.go)

	rwait spin.Adaptive // the reader's polling window: readLoop's alone
}

// conns numbers the control-socket connections of the process.
var conns atomic.Uint64

// ownGroup is the group of a connection that joined none: itself.
func ownGroup(conn uint64) string { return "c:" + strconv.FormatUint(conn, 10) }

// directMax is the largest answer written straight from the producer.
const directMax = 64 << 10

// clientQueue bounds answers and notifications queued for one client; a
// client that lets it fill is not reading and is disconnected.
const clientQueue = 8192

func (c *client) close() {
	c.once.Do(func() {
		close(c.dead)
		_ = c.conn.Close()
		c.l.mu.Lock()
		delete(c.l.clients, c)
		delete(c.l.subs, c)
		c.l.mu.Unlock()
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
		c.l.log.Error("control client is not reading its answers; disconnecting it")
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
	c.reply(&wire.Fail{Req: req, Code: status.Code(err), Message: err.Error()})
}

// answer replies OK to request req, or Fail with err.
func (c *client) answer(req uint64, err error) {
	if err != nil {
		c.fail(req, err)
		return
	}
	c.reply(&wire.OK{Req: req})
}

func (c *client) writeLoop() {
	defer c.l.wg.Done()
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
	n := conns.Add(1)
	c.l.mu.Lock()
	c.owner = Owner{Conn: n, Group: ownGroup(n)}
	c.l.mu.Unlock()
	defer c.l.wg.Done()
	defer c.wg.Done()
	// Once every request is answered: what the connection registered goes.
	defer func() { c.l.b.Closed(c.owner) }()
	defer c.waits.Wait()
	defer c.closePieces()
	defer c.close()
	var buf []byte
	c.rwait = c.l.readSpin.New()
	for {
		var (
			h   wire.Header
			m   wire.Msg
			fd  int
			err error
		)
		spin.Await(c.conn, &c.rwait)
		h, m, fd, buf, err = unixsock.ReadFrame(c.conn, buf)
		var bad *unixsock.BadRequest
		if errors.As(err, &bad) && bad.Req != 0 {
			code := wire.CodeMalformed
			if errors.Is(bad.Err, wire.ErrOverflow) {
				code = wire.CodeOutOfRange
			}
			c.reply(&wire.Fail{Req: bad.Req, Code: code, Message: bad.Err.Error()})
			if h.Type == wire.TypeSubmitMore {
				c.badPiece(bad.Req, status.Errorf(code, "a piece of request %d did not decode: %v", bad.Req, bad.Err))
			}
			continue
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.l.log.Warn("control client sent a bad frame; disconnecting it", zap.Error(err))
				c.reply(&wire.Fail{Code: wire.CodeMalformed, Message: err.Error()})
				time.Sleep(10 * time.Millisecond) // let the answer go out
			}
			return
		}
		c.handle(m, fd)
	}
}
