// Package unixsock holds what the sidecar's two Unix sockets share: the
// control socket engines talk to and the node socket same-node peers
// take handles from. Both carry wire frames, with at most one fd per
// frame as SCM_RIGHTS (wire.FlagFD), and both live in a 0700 directory as
// 0600 sockets.
package unixsock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/wire"
)

// Listen creates a Unix stream socket at path that only this user can
// reach: its directory checked and made (or chmodded) 0700 by MakeDir,
// the socket 0600, with no moment at which it has other bits (umask while
// it is created). The socket file goes when the listener closes.
func Listen(path string, trustParent bool) (*net.UnixListener, error) {
	if err := MakeDir(filepath.Dir(path), trustParent); err != nil {
		return nil, err
	}
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("%s: chmod 0600: %w", path, err)
	}
	return ln, nil
}

// ReadFrame reads one frame from conn and, with FlagFD, the fd sent with
// it (-1 when none; the caller owns it). Any fd that arrives unasked is
// closed. buf is reused for the body when it is large enough; the buffer
// used is returned for the next call. A whole frame whose body does not
// decode is a *BadRequest: the stream is still in step.
func ReadFrame(conn *net.UnixConn, buf []byte) (wire.Header, wire.Msg, int, []byte, error) {
	fd := -1
	var hb [wire.HeaderSize]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	got := 0
	for got < wire.HeaderSize {
		n, oobn, _, _, err := conn.ReadMsgUnix(hb[got:], oob)
		if oobn > 0 {
			for _, f := range ParseFDs(oob[:oobn]) {
				if fd < 0 {
					fd = f
				} else {
					_ = unix.Close(f)
				}
			}
		}
		if err != nil {
			CloseFD(fd)
			return wire.Header{}, nil, -1, buf, err
		}
		if n == 0 {
			CloseFD(fd)
			return wire.Header{}, nil, -1, buf, io.EOF
		}
		got += n
	}
	h, err := wire.ParseHeader(hb[:])
	if err != nil {
		CloseFD(fd)
		return h, nil, -1, buf, err
	}
	if h.Flags&wire.FlagFD == 0 && fd >= 0 {
		CloseFD(fd)
		fd = -1
	}
	if cap(buf) < int(h.Length) {
		buf = make([]byte, h.Length)
	}
	body := buf[:h.Length]
	if _, err := io.ReadFull(conn, body); err != nil {
		CloseFD(fd)
		return h, nil, -1, buf, err
	}
	if err := wire.VerifyCRC(h, body); err != nil {
		CloseFD(fd)
		return h, nil, -1, buf, err
	}
	m, err := wire.Decode(h.Type, body)
	if err != nil {
		CloseFD(fd)
		var req uint64
		if len(body) >= 8 {
			req = binary.LittleEndian.Uint64(body)
		}
		return h, nil, -1, buf, &BadRequest{Req: req, Err: err}
	}
	if h.Flags&wire.FlagFD != 0 && fd < 0 {
		return h, nil, -1, buf, errors.New("frame says an fd travels with it, but none arrived")
	}
	return h, m, fd, buf, nil
}

// BadRequest is a whole frame whose body did not decode; Req is its
// request id (the first 8 bytes of every request), 0 when too short.
type BadRequest struct {
	Req uint64
	Err error
}

func (e *BadRequest) Error() string { return e.Err.Error() }
func (e *BadRequest) Unwrap() error { return e.Err }

// WriteFrame writes m as one frame, with fd (when >= 0) as SCM_RIGHTS in
// the same sendmsg; fd stays the caller's.
func WriteFrame(c *net.UnixConn, m wire.Msg, fd int) error {
	var flags wire.Flags
	var oob []byte
	if fd >= 0 {
		flags, oob = wire.FlagFD, unix.UnixRights(fd)
	}
	b := wire.AppendFrame(nil, m, false, flags)
	n, oobn, err := c.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return fmt.Errorf("write %s frame: %w", m.Type(), err)
	}
	if n != len(b) || oobn != len(oob) {
		return fmt.Errorf("write %s frame: short write (%d of %d B, %d of %d control B)", m.Type(), n, len(b), oobn, len(oob))
	}
	return nil
}

// ParseFDs returns the fds of the SCM_RIGHTS messages in oob.
func ParseFDs(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if f, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

// CloseFD closes fd unless it is negative (none).
func CloseFD(fd int) {
	if fd >= 0 {
		_ = unix.Close(fd)
	}
}

// CloseFDs closes every fd of fds that is not negative.
func CloseFDs(fds []int) {
	for _, fd := range fds {
		CloseFD(fd)
	}
}
