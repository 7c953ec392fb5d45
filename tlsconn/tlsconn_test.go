package tlsconn

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stage-kv/stage/internal/certgen"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair returns the two ends of a mutually authenticated TLS 1.3 connection
// over loopback TCP.
func pair(t testing.TB) (a, b *Conn) {
	t.Helper()
	ca, err := certgen.NewCA("tlsconn test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert := func(name string) tls.Certificate {
		der, key, err := ca.Issue(certgen.Leaf{Name: name, Hosts: []string{"127.0.0.1"}})
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	srv := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert("srv")}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	cli := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert("cli")}, RootCAs: pool, ServerName: "127.0.0.1"}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   *tls.Conn
		err error
	}
	got := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- res{nil, err}
			return
		}
		tc := tls.Server(c, srv)
		got <- res{tc, tc.Handshake()}
	}()
	c1, err := tls.Dial("tcp", ln.Addr().String(), cli)
	if err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if a, err = New(c1, 2); err != nil {
		t.Fatal(err)
	}
	if b, err = New(r.c, 2); err != nil {
		t.Fatal(err)
	}
	return a, b
}

func closePair(a, b *Conn) {
	for _, c := range []*Conn{a, b} {
		c.Shutdown()
		c.Done()
		c.Done()
	}
}

func TestWritevReadFull(t *testing.T) {
	a, b := pair(t)
	defer closePair(a, b)
	r := rand.New(rand.NewPCG(1, 2))
	for _, sizes := range [][]int{{16, 1 << 20}, {1}, {3, 5, 7, 4 << 20}, {64 << 10, 0, 9}} {
		var want []byte
		var bufs [][]byte
		for _, n := range sizes {
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(r.Uint32())
			}
			want = append(want, p...)
			bufs = append(bufs, p)
		}
		errc := make(chan error, 1)
		go func() { errc <- a.Writev(bufs) }()
		got := make([]byte, len(want))
		if err := b.ReadFull(got); err != nil {
			t.Fatalf("sizes %v: read: %v", sizes, err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("sizes %v: write: %v", sizes, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("sizes %v: bytes differ", sizes)
		}
	}
}

func TestReadDiscardTryWrite(t *testing.T) {
	a, b := pair(t)
	defer closePair(a, b)
	if n, err := b.TryWrite([]byte("ack")); n != 0 || err != nil {
		t.Fatalf("TryWrite: got %d, %v; want 0, nil (the writer sends it)", n, err)
	}
	msg := append(bytes.Repeat([]byte{7}, 100_000), "tail"...)
	go func() { _ = a.Writev([][]byte{msg}) }()
	if err := b.Discard(100_000, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	var got []byte
	buf := make([]byte, 16)
	for len(got) < 4 {
		n, err := b.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if string(got) != "tail" {
		t.Fatalf("got %q after the discarded bytes, want \"tail\"", got)
	}
}

// TestShutdownWakes: a reader waiting for bytes and a writer blocked on a
// peer that reads nothing both return ErrShutdown, and the peer sees the
// stream end.
func TestShutdownWakes(t *testing.T) {
	a, b := pair(t)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() { defer wg.Done(); errs <- a.ReadFull(make([]byte, 10)) }()
	go func() { defer wg.Done(); errs <- a.Writev([][]byte{make([]byte, 64<<20)}) }()
	time.Sleep(200 * time.Millisecond) // let both block
	a.Shutdown()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not wake the reader and the writer")
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, ErrShutdown) {
			t.Errorf("got %v, want ErrShutdown", err)
		}
	}
	a.Done()
	a.Done()
	// The peer drains what was sent, then sees the end.
	err := b.Discard(1<<40, make([]byte, 1<<20))
	if err == nil || errors.Is(err, ErrShutdown) {
		t.Errorf("peer: got %v, want the stream's end", err)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		t.Logf("peer saw: %v", err)
	}
	b.Shutdown()
	b.Done()
	b.Done()
}

func TestNewNeedsHandshake(t *testing.T) {
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	if _, err := New(tls.Client(c1, &tls.Config{}), 2); err == nil {
		t.Fatal("New accepted a connection before its handshake")
	}
}

// TestNoAllocs: a chunk's round trip allocates nothing of its own once the
// buffers grew. crypto/tls itself allocates one small reader object for
// each socket read (at most one per 16 KiB record); nothing grows with
// the bytes.
func TestNoAllocs(t *testing.T) {
	a, b := pair(t)
	defer closePair(a, b)
	head := make([]byte, 64)
	payload := make([]byte, 1<<20)
	bufs := make([][]byte, 2)
	in := make([]byte, len(head)+len(payload))
	done := make(chan error, 1)
	step := func() {
		bufs[0], bufs[1] = head, payload
		go func() { done <- a.Writev(bufs) }()
		if err := b.ReadFull(in); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		step()
	}
	// The goroutine and its closure cost a few allocations of their own.
	const records = (1<<20 + 64) / (16 << 10)
	if n := testing.AllocsPerRun(20, step); n > records+1+4 {
		t.Errorf("got %.0f allocations per 1 MiB chunk, want at most %d (one per record read, and the goroutine's)", n, records+1+4)
	}
}

func BenchmarkChunk4MiB(b *testing.B) {
	x, y := pair(b)
	defer closePair(x, y)
	payload := make([]byte, 4<<20)
	in := make([]byte, len(payload))
	b.SetBytes(int64(len(payload)))
	go func() {
		for range b.N {
			if err := x.Writev([][]byte{payload}); err != nil {
				return
			}
		}
	}()
	for range b.N {
		if err := y.ReadFull(in); err != nil {
			b.Fatal(err)
		}
	}
}

// TestQueued: the socket's unacknowledged bytes grow past a MiB while the
// peer reads nothing (TLS records: a little over the plaintext) and come
// back to 0 once it read everything.
func TestQueued(t *testing.T) {
	a, b := pair(t)
	defer closePair(a, b)
	queued := func(done func(uint64) bool) uint64 {
		t.Helper()
		var q uint64
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			var err error
			if q, err = a.Queued(); err != nil {
				t.Fatal(err)
			}
			if done(q) {
				break
			}
		}
		return q
	}
	msg := bytes.Repeat([]byte{1}, 8<<20)
	done := make(chan error, 1)
	go func() { done <- a.Writev([][]byte{msg}) }()
	if q := queued(func(q uint64) bool { return q > 1<<20 }); q <= 1<<20 {
		t.Fatalf("Queued = %d with 8 MiB written and nothing read, want over 1 MiB", q)
	}
	if err := b.Discard(int64(len(msg)), make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if q := queued(func(q uint64) bool { return q == 0 }); q != 0 {
		t.Fatalf("Queued = %d after the peer read everything, want 0", q)
	}
}
