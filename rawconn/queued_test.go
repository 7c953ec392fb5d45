package rawconn

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"time"
)

// TestQueued: with nobody reading, every byte written stays unacknowledged
// or unsent in the sender's socket up to what the receiver's buffer took;
// Queued counts them, and drops to 0 once the reader drained everything.
// After the socket closed it fails.
func TestQueued(t *testing.T) {
	a, b := pair(t)
	if n, err := a.Queued(); err != nil || n != 0 {
		t.Fatalf("idle socket: Queued = %d, %v; want 0", n, err)
	}
	p := bytes.Repeat([]byte{7}, 64<<10)
	sent := 0
	for {
		n, err := a.TryWrite(p)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		sent += n
	}
	q, err := a.Queued()
	if err != nil {
		t.Fatal(err)
	}
	// Loopback acks what the receiving socket took; what is left queued is
	// the sender's full buffer, more than nothing and at most all sent.
	if q == 0 || q > uint64(sent) {
		t.Fatalf("full socket: Queued = %d after %d B sent with nobody reading", q, sent)
	}
	if err := b.Discard(int64(sent), make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for q != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		if q, err = a.Queued(); err != nil {
			t.Fatal(err)
		}
	}
	if q != 0 {
		t.Fatalf("drained socket: Queued = %d, want 0", q)
	}
	closePair(a, b, 2)
	if _, err := a.Queued(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("closed socket: Queued error %v, want net.ErrClosed", err)
	}
}

// BenchmarkQueued compares the two ways of reading a socket's queued
// bytes: SIOCOUTQ (what Queued uses) and TCP_INFO.
func BenchmarkQueued(b *testing.B) {
	a, c := pair(b)
	defer closePair(a, c, 2)
	if _, err := a.TryWrite(bytes.Repeat([]byte{1}, 1<<20)); err != nil {
		b.Fatal(err)
	}
	for _, m := range []struct {
		name string
		f    func(int) (uint64, error)
	}{{"ioctl", tcpQueued}, {"tcpinfo", tcpQueuedInfo}} {
		b.Run(m.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := m.f(a.fd); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
