package engine

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/wire"
)

// Admission: an accepted connection holds one of limits.max_clients from
// the start, but is served (reader, writer, a client) only once its first
// request arrives. One that sends nothing for FirstRequestTimeout is
// refused: told why in a Fail with Req 0 (which the clients surface as the
// connection's error) and closed. So connections that never talk cannot
// keep every slot; any request counts (an engine's Register or Subscribe,
// stagectl's Query), and they come at once.

// admit waits for c's first bytes, up to l.firstReq, then serves it or
// refuses it.
func (l *Listener) admit(c *net.UnixConn) {
	defer l.wg.Done()
	err := waitReadable(c, l.firstReq)
	switch {
	case err == nil:
		l.start(c)
		return
	case errors.Is(err, os.ErrDeadlineExceeded):
		refuse(c, wire.CodeTimeout, fmt.Sprintf("no request within limits.client_first_request_timeout (%s) of connecting; send a request (Register, Subscribe, Query) at once after connecting, or connect when you need the sidecar", l.firstReq))
		l.log.Warn("control socket: a connection sent no request in time; closed it",
			zap.Duration("limits.client_first_request_timeout", l.firstReq))
	default:
		_ = c.Close() // closed by Close, or the socket failed
	}
	l.mu.Lock()
	delete(l.waiting, c)
	l.mu.Unlock()
}

// waitReadable waits until c has something to read (or its peer hung up),
// at most d (0: no limit), and consumes nothing: the first frame, with its
// fd, stays for the reader.
func waitReadable(c *net.UnixConn, d time.Duration) error {
	if d > 0 {
		if err := c.SetReadDeadline(time.Now().Add(d)); err != nil {
			return err
		}
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var perr error
	err = raw.Read(func(fd uintptr) bool {
		for {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				perr = fmt.Errorf("poll control connection: %w", err)
				return true
			}
			return n > 0 // false: the runtime waits until it is readable
		}
	})
	if err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	return c.SetReadDeadline(time.Time{})
}

// refuse tells a connection why it is closed (a Fail with Req 0, written
// with a short deadline: the socket's buffer is empty) and closes it.
func refuse(c *net.UnixConn, code wire.Code, msg string) {
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = c.Write(wire.AppendFrame(nil, &wire.Fail{Code: code, Message: msg}, false, 0))
	_ = c.Close()
}
