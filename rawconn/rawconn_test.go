package rawconn

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stage-kv/stage/internal/spin"
)

func pair(t testing.TB) (a, b *Conn) {
	t.Helper()
	a, b, err := loopbackPair(2)
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

func TestWritevReadFull(t *testing.T) {
	a, b := pair(t)
	defer closePair(a, b, 2)
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
		done := make(chan error, 1)
		go func() { done <- a.Writev(bufs) }()
		got := make([]byte, len(want))
		if err := b.ReadFull(got); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("sizes %v: bytes differ", sizes)
		}
	}
	// Discard drops exactly n bytes.
	go func() { _ = a.Writev([][]byte{bytes.Repeat([]byte{1}, 1000), {42}}) }()
	if err := b.Discard(1000, make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	one := make([]byte, 1)
	if err := b.ReadFull(one); err != nil || one[0] != 42 {
		t.Fatalf("after discard: got %v %v, want 42", one, err)
	}
}

func TestShutdownWakesReader(t *testing.T) {
	a, b := pair(t)
	errc := make(chan error, 1)
	go func() { errc <- b.ReadFull(make([]byte, 10)) }()
	time.Sleep(50 * time.Millisecond)
	b.Shutdown()
	select {
	case err := <-errc:
		if !errors.Is(err, io.ErrUnexpectedEOF) && err == nil {
			t.Fatalf("got %v, want an error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a blocked ReadFull did not return after Shutdown")
	}
	b.Done()
	b.Done()
	// The peer sees the connection end.
	if err := a.ReadFull(make([]byte, 1)); err == nil {
		t.Fatal("peer read succeeded after shutdown")
	}
	a.Shutdown()
	a.Done()
	a.Done()
}

// TestTryWriteNeverBlocks: with nobody reading, TryWrite fills the socket
// buffers and then returns 0 instead of blocking; every byte it said it
// sent arrives, in order.
func TestTryWriteNeverBlocks(t *testing.T) {
	a, b := pair(t)
	defer closePair(a, b, 2)
	p := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	var sent int
	full := false
	deadline := time.Now().Add(10 * time.Second)
	for !full && time.Now().Before(deadline) {
		n, err := a.TryWrite(p)
		if err != nil {
			t.Fatalf("TryWrite: %v", err)
		}
		if n == 0 {
			full = true
		}
		sent += n
		p = append(p[n:], p[:n]...) // keep the stream a repeating pattern
	}
	if !full {
		t.Fatalf("sent %d B without the buffers filling", sent)
	}
	got := make([]byte, sent)
	if err := b.ReadFull(got); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("0123456789abcdef"), sent/16+1)[:sent]
	if !bytes.Equal(got, want) {
		t.Fatal("bytes differ")
	}
}

// TestSpinRead: with polling on, fixed or adaptive, frames that arrive
// during the poll, after it, and in pieces all read whole and in order;
// EOF still reports.
func TestSpinRead(t *testing.T) {
	for _, p := range []spin.Policy{spin.Fixed(2 * time.Millisecond), {Base: 2 * time.Millisecond, Max: 10 * time.Millisecond}} {
		t.Run(p.String(), func(t *testing.T) { spinRead(t, p) })
	}
}

func spinRead(t *testing.T, p spin.Policy) {
	a, b := pair(t)
	defer closePair(a, b, 2)
	b.SetSpin(p)
	for _, gap := range []time.Duration{0, 500 * time.Microsecond, 20 * time.Millisecond, 0, 3 * time.Millisecond, 3 * time.Millisecond, 3 * time.Millisecond, 3 * time.Millisecond} {
		want := bytes.Repeat([]byte{byte(gap.Microseconds())}, 100000)
		go func() {
			time.Sleep(gap)
			_ = a.Writev([][]byte{want[:7], want[7:]})
		}()
		got := make([]byte, len(want))
		if err := b.ReadFull(got); err != nil {
			t.Fatalf("gap %v: %v", gap, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("gap %v: bytes differ", gap)
		}
	}
	b.Shutdown()
	if err := b.ReadFull(make([]byte, 1)); err == nil {
		t.Fatal("read after shutdown: got nil, want an error")
	}
}
