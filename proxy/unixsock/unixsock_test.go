package unixsock

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair returns two connected Unix stream sockets.
func pair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// sameFile reports whether two fds name one open file.
func sameFile(t *testing.T, a, b int) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Fstat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

func TestFrameRoundTrip(t *testing.T) {
	memfd, err := unix.MemfdCreate("unixsock-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseFD(memfd)
	for _, tc := range []struct {
		name   string
		msg    wire.Msg
		fd     int
		wantFD bool
	}{
		{"no fd", &wire.OK{Req: 7}, -1, false},
		{"with fd", &wire.Fail{Req: 9, Code: wire.CodeDevice, Message: "x"}, memfd, true},
	} {
		a, b := pair(t)
		if err := WriteFrame(a, tc.msg, tc.fd); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		_, m, fd, _, err := ReadFrame(b, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if m.Type() != tc.msg.Type() {
			t.Errorf("%s: got %s, want %s", tc.name, m.Type(), tc.msg.Type())
		}
		if got := fd >= 0; got != tc.wantFD {
			t.Errorf("%s: fd %d, want one: %v", tc.name, fd, tc.wantFD)
		}
		if fd >= 0 && !sameFile(t, fd, memfd) {
			t.Errorf("%s: fd %d is not the memfd sent", tc.name, fd)
		}
		CloseFD(fd)
	}
}

func TestReadFrameErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		frame []byte
		req   uint64 // a *BadRequest with this Req; 0: another error
	}{
		{"bad magic", make([]byte, wire.HeaderSize), 0},
		{"short body", func() []byte {
			b := wire.AppendFrame(nil, &wire.Fail{Req: 42, Message: "abc"}, false, 0)
			return b[:len(b)-1] // the header claims a byte that never comes
		}(), 0},
		{"bad request keeps its id", func() []byte {
			b := wire.AppendFrame(nil, &wire.OK{Req: 42}, false, 0)
			b = append(b, 0xff) // one byte past what OK decodes
			h, _ := wire.ParseHeader(b)
			h.Length++
			return append(wire.AppendHeader(nil, h), b[wire.HeaderSize:]...)
		}(), 42},
	} {
		a, b := pair(t)
		if _, err := a.Write(tc.frame); err != nil {
			t.Fatal(err)
		}
		_ = a.Close()
		_, m, fd, _, err := ReadFrame(b, nil)
		if err == nil || m != nil || fd != -1 {
			t.Fatalf("%s: got %v, fd %d, err %v; want an error and nothing else", tc.name, m, fd, err)
		}
		var bad *BadRequest
		if got := errors.As(err, &bad); got != (tc.req != 0) || (got && bad.Req != tc.req) {
			t.Errorf("%s: err %v (BadRequest %v), want BadRequest with req %d: %v", tc.name, err, got, tc.req, tc.req != 0)
		}
	}
}

func TestListenModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sock")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "s.sock")
	ln, err := Listen(path, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		want os.FileMode
	}{{dir, 0o700}, {path, 0o600}} {
		st, err := os.Stat(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode().Perm(); got != tc.want {
			t.Errorf("%s: mode %#o, want %#o", tc.path, got, tc.want)
		}
	}
	_ = ln.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("socket file left after Close: %v", err)
	}
}
