package pagemap

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// A renewed range reads zero at the same address while a pipe that took
// the old pages with vmsplice still reads the old bytes: the property the
// splice send path relies on. The rest of the mapping is untouched.
func TestRenewKeepsOldPagesForThePipe(t *testing.T) {
	pg := os.Getpagesize()
	b, err := Map(3 * pg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := Unmap(b); err != nil {
			t.Error(err)
		}
	}()
	for i := range b {
		b[i] = byte(i/pg + 1)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	mid := b[pg : 2*pg]
	iov := []unix.Iovec{{Base: &mid[0]}}
	iov[0].SetLen(len(mid))
	if n, err := unix.Vmsplice(p[1], iov, 0); err != nil || n != pg {
		t.Fatalf("vmsplice: %d, %v", n, err)
	}
	if err := Renew(mid); err != nil {
		t.Fatal(err)
	}
	if Addr(mid) != Addr(b)+uintptr(pg) {
		t.Fatal("renewed range moved")
	}
	for i, v := range b {
		want := byte(i/pg + 1)
		if i/pg == 1 {
			want = 0
		}
		if v != want {
			t.Fatalf("byte %d after renewal: got %d, want %d", i, v, want)
		}
	}
	got := make([]byte, pg)
	if n, err := unix.Read(p[0], got); err != nil || n != pg {
		t.Fatalf("read pipe: %d, %v", n, err)
	}
	for i, v := range got {
		if v != 2 {
			t.Fatalf("pipe byte %d: got %d, want the old 2", i, v)
		}
	}
}

func TestRenewRejectsUnaligned(t *testing.T) {
	pg := os.Getpagesize()
	b, err := Map(2 * pg)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(b)
	for _, tc := range []struct {
		name string
		r    []byte
	}{
		{"empty", b[:0]},
		{"odd start", b[1 : pg+1]},
		{"odd length", b[:pg-8]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Renew(tc.r); !errors.Is(err, ErrUnaligned) {
				t.Fatalf("got %v, want ErrUnaligned", err)
			}
		})
	}
	if _, err := Map(pg + 1); !errors.Is(err, ErrUnaligned) {
		t.Fatalf("Map(page+1): got %v, want ErrUnaligned", err)
	}
}
