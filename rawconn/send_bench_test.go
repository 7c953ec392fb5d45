package rawconn

import (
	"testing"
)

// The two ways a data stream sends a chunk, on one loopback connection
// with a reader draining it: 4 MiB payloads from 16 rotating slots, each
// rewritten before it is sent again (as a gather refills a slot), so the
// sender's copy (writev) reads cache-cold bytes as it does in a sidecar.
// Their ratio on a machine says whether splice send pays there: it did on
// the GPU hosts and did not on the 2-core CPU machine (docs/BENCHMARKS.md).

const (
	benchPayload = 4 << 20
	benchSlots   = 16 // 64 MiB: more than loopback socket buffers hold, so a
	// rewritten slot's earlier spliced bytes have been read by then
)

func BenchmarkSendWritev(b *testing.B) { benchSend(b, false) }
func BenchmarkSendSplice(b *testing.B) { benchSend(b, true) }

func benchSend(b *testing.B, splice bool) {
	a, r := pair(b)
	defer closePair(a, r, 2)
	slots := make([][]byte, benchSlots)
	for i := range slots {
		slots[i] = mmapped(b, benchPayload, uint64(i))
	}
	head := make([]byte, 64)
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 1<<20)
		left := int64(b.N) * int64(len(head)+benchPayload)
		for left > 0 {
			n, err := r.Read(buf[:min(int64(len(buf)), left)])
			if err != nil {
				done <- err
				return
			}
			left -= int64(n)
		}
		done <- nil
	}()
	b.SetBytes(benchPayload)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := slots[i%benchSlots]
		for j := 0; j < len(p); j += 4096 {
			p[j] = byte(i) // dirty every page, as a refill does
		}
		var err error
		if splice {
			_, _, err = a.WriteSplice(head, p)
		} else {
			err = a.Writev([][]byte{head, p})
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
