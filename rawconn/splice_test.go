package rawconn

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// mmapped returns n bytes of anonymous memory, as pinned slots are, filled
// with random bytes, unmapped at the end of the test.
func mmapped(t testing.TB, n int, seed uint64) []byte {
	t.Helper()
	if n == 0 {
		return nil
	}
	pg := os.Getpagesize()
	b, err := unix.Mmap(-1, 0, (n+pg-1)/pg*pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	r := rand.New(rand.NewPCG(seed, 3))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b[:n]
}

// sendSplice writes frames of head+payload with WriteSplice while b reads
// them; every byte must arrive in order.
func sendSplice(t *testing.T, a, b *Conn, head []byte, payloads [][]byte, wantSpliced bool) {
	t.Helper()
	var want []byte
	for _, p := range payloads {
		want = append(append(want, head...), p...)
	}
	got := make([]byte, len(want))
	errc := make(chan error, 1)
	go func() { errc <- b.ReadFull(got) }()
	for i, p := range payloads {
		spliced, refused, err := a.WriteSplice(head, p)
		if err != nil {
			t.Fatalf("payload %d (%d B): %v", i, len(p), err)
		}
		if want := wantSpliced && len(p) > 0; spliced != want || (refused != nil) == wantSpliced {
			t.Fatalf("payload %d (%d B): spliced %v refused %v, want spliced %v", i, len(p), spliced, refused, want)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("bytes differ from %d on", firstDiff(got, want))
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func TestWriteSplice(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sizes   []int
		pipeMax int // 0: the system's
	}{
		{"one byte", []int{1}, 0},
		{"empty payload", []int{0, 5}, 0},
		{"one slot", []int{4 << 20}, 0},
		{"odd sizes", []int{3, 4095, 4097, 1<<20 + 7}, 0},
		{"many rounds through a small pipe", []int{9<<20 + 13, 64 << 10}, 64 << 10},
		{"larger than the pipe", []int{16 << 20}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.pipeMax > 0 {
				old := pipeMax
				pipeMax = func() int { return tc.pipeMax }
				defer func() { pipeMax = old }()
			}
			a, b := pair(t)
			defer closePair(a, b, 2)
			var ps [][]byte
			for i, n := range tc.sizes {
				ps = append(ps, mmapped(t, n, uint64(i)))
			}
			sendSplice(t, a, b, []byte("head:"), ps, true)
			if tc.pipeMax > 0 && a.pipeCap > tc.pipeMax {
				t.Fatalf("pipe of %d B, want at most %d", a.pipeCap, tc.pipeMax)
			}
		})
	}
}

// When vmsplice refuses the memory, the payload goes by writev, intact,
// and the refusal is reported.
func TestWriteSpliceFallback(t *testing.T) {
	for _, errno := range []unix.Errno{unix.EFAULT, unix.EINVAL, unix.ENOSYS} {
		t.Run(unix.ErrnoName(errno), func(t *testing.T) {
			old := vmspliceFn
			vmspliceFn = func(int, []byte) (int, error) { return 0, errno }
			defer func() { vmspliceFn = old }()
			a, b := pair(t)
			defer closePair(a, b, 2)
			sendSplice(t, a, b, []byte("hd"), [][]byte{mmapped(t, 3<<20, 9)}, false)
		})
	}
	// Any other vmsplice error fails the write.
	old := vmspliceFn
	vmspliceFn = func(int, []byte) (int, error) { return 0, unix.ENOMEM }
	defer func() { vmspliceFn = old }()
	a, b := pair(t)
	defer closePair(a, b, 2)
	if _, refused, err := a.WriteSplice([]byte("h"), mmapped(t, 4096, 1)); !errors.Is(err, unix.ENOMEM) || refused != nil {
		t.Fatalf("got refused %v err %v, want ENOMEM as the error", refused, err)
	}
}

// A writer blocked in splice on a full socket (the peer reads nothing)
// returns with an error once the Conn is shut down.
func TestShutdownWakesSplicer(t *testing.T) {
	a, b := pair(t)
	payload := mmapped(t, 8<<20, 4)
	errc := make(chan error, 1)
	go func() {
		for {
			if _, _, err := a.WriteSplice([]byte("h"), payload); err != nil {
				errc <- err
				return
			}
		}
	}()
	select {
	case err := <-errc:
		t.Fatalf("write failed before shutdown: %v", err)
	case <-time.After(300 * time.Millisecond): // the socket buffers are full by now
	}
	a.Shutdown()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("got nil, want an error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a blocked WriteSplice did not return after Shutdown")
	}
	closePair(a, b, 2)
}

// The splice pipe closes with the Conn, also after a failed write made a
// second one: no descriptor outlives the pair.
func TestSpliceNoFDLeak(t *testing.T) {
	before := openFDs(t)
	a, b := pair(t)
	sendSplice(t, a, b, []byte("x"), [][]byte{mmapped(t, 1<<20, 5)}, true)
	a.dropPipe() // as a failed write does
	sendSplice(t, a, b, []byte("x"), [][]byte{mmapped(t, 1<<20, 6)}, true)
	closePair(a, b, 2)
	if after := openFDs(t); after != before {
		t.Fatalf("%d fds open after, %d before", after, before)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	return len(es)
}
