package proxy

import (
	"errors"
	"testing"
	"time"
)

// movedConn is a streamConn whose kernel byte counts the test sets.
type movedConn struct {
	streamConn
	acked, recvd uint64
	err          error
}

func (m *movedConn) Moved() (uint64, uint64, error) { return m.acked, m.recvd, m.err }

// The watchdog declares a stream stalled only when it has been inside a
// write (or a chunk read) for the limit without the count of that
// direction moving; traffic the other way, idle time and a closed socket
// never count.
func TestStallWatch(t *testing.T) {
	type tick struct {
		at               time.Duration
		writing, reading bool
		acked, recvd     uint64
		err              error
		want             string
	}
	const limit = 2 * time.Second
	for _, tc := range []struct {
		name  string
		ticks []tick
	}{
		{"write stalls", []tick{{0, true, false, 10, 0, nil, ""}, {time.Second, true, false, 10, 0, nil, ""}, {limit, true, false, 10, 0, nil, "write"}}},
		{"slow write moves", []tick{{0, true, false, 10, 0, nil, ""}, {1500 * time.Millisecond, true, false, 11, 0, nil, ""}, {3 * time.Second, true, false, 11, 0, nil, ""}, {3500 * time.Millisecond, true, false, 11, 0, nil, "write"}}},
		{"idle in between resets", []tick{{0, true, false, 10, 0, nil, ""}, {time.Second, false, false, 10, 0, nil, ""}, {1500 * time.Millisecond, true, false, 10, 0, nil, ""}, {3 * time.Second, true, false, 10, 0, nil, ""}, {3500 * time.Millisecond, true, false, 10, 0, nil, "write"}}},
		{"received bytes do not excuse a stuck write", []tick{{0, true, false, 10, 0, nil, ""}, {time.Second, true, false, 10, 5, nil, ""}, {limit, true, false, 10, 9, nil, "write"}}},
		{"half-read chunk stalls", []tick{{0, false, true, 0, 7, nil, ""}, {limit, false, true, 0, 7, nil, "read"}}},
		{"read moving", []tick{{0, false, true, 0, 7, nil, ""}, {limit, false, true, 0, 8, nil, ""}}},
		{"idle is never a stall", []tick{{0, false, false, 1, 1, nil, ""}, {time.Minute, false, false, 1, 1, nil, ""}}},
		{"closed socket", []tick{{0, true, true, 1, 1, nil, ""}, {time.Minute, true, true, 1, 1, errors.New("closed"), ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mc := &movedConn{}
			ds := &dataStream{rc: mc}
			var w stallWatch
			base := time.Unix(1000, 0)
			for i, tk := range tc.ticks {
				ds.writing.Store(0)
				ds.reading.Store(0)
				if tk.writing {
					ds.writing.Store(1)
				}
				if tk.reading {
					ds.reading.Store(1)
				}
				mc.acked, mc.recvd, mc.err = tk.acked, tk.recvd, tk.err
				if got := w.check(ds, base.Add(tk.at), limit); got != tk.want {
					t.Fatalf("tick %d (%v): %q, want %q", i, tk.at, got, tk.want)
				}
			}
		})
	}
}
