package spin

import (
	"net"
	"testing"
	"time"
)

func TestReadable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	cl, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	srv := <-acc
	defer srv.Close()
	tc := srv.(*net.TCPConn)
	rc, err := tc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	poll := func(d time.Duration) (got bool) {
		_ = rc.Control(func(fd uintptr) { got = Poll(int(fd), d) })
		return got
	}
	// Nothing sent: the poll gives up after about d.
	start := time.Now()
	if poll(2 * time.Millisecond) {
		t.Fatal("Poll reported input on an idle socket")
	}
	if el := time.Since(start); el < 2*time.Millisecond {
		t.Fatalf("Poll gave up after %s, before its 2ms", el)
	}
	// Bytes on their way: the poll sees them.
	go func() {
		time.Sleep(time.Millisecond)
		_, _ = cl.Write([]byte("x"))
	}()
	if !poll(5 * time.Second) {
		t.Fatal("Poll missed the byte that arrived")
	}
	Readable(tc, time.Second) // returns at once: the byte is there
	buf := make([]byte, 1)
	if n, err := srv.Read(buf); n != 1 || err != nil {
		t.Fatalf("read after Readable: %d, %v", n, err)
	}
	// The peer's close counts as readable (the read returns EOF).
	cl.Close()
	if !poll(5 * time.Second) {
		t.Fatal("Poll missed the peer's close")
	}
	// d <= 0 returns at once.
	Readable(tc, 0)
}

func TestFor(t *testing.T) {
	for _, tc := range []struct {
		ncpu int
		want time.Duration
	}{{1, 0}, {2, 0}, {MinCPUs - 1, 0}, {MinCPUs, Window}, {16, Window}, {128, Window}} {
		if got := For(tc.ncpu); got != tc.want {
			t.Errorf("For(%d) = %s, want %s", tc.ncpu, got, tc.want)
		}
	}
}
