package proxytest

import (
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stage-kv/stage/proxy"
)

// idleTimeout is how long a sidecar may take to settle or to go idle.
const idleTimeout = 10 * time.Second

// ExpectIdle waits until s has at least sessions peer sessions and takes
// its figures then. When the test ends, after the cleanups the test
// registers later (its regions unregistered) and before s closes, s must
// be back to them: no slot in use, no transfer active, no peer mapping,
// regions and mappings as then, nothing Leaks reports. This is e2e's idle
// check, on figures of one sidecar: goroutines and fds are the process's
// here, NoLeaks checks those.
func (s *Sidecar) ExpectIdle(t testing.TB, sessions int) {
	t.Helper()
	if err := s.WaitSessions(sessions, idleTimeout); err != nil {
		t.Fatal(err)
	}
	base := s.Snapshot()
	t.Cleanup(func() {
		if err := s.waitIdle(base, idleTimeout); err != nil {
			t.Error(err)
		}
	})
}

// waitIdle waits until s is back to base, or says what is not.
func (s *Sidecar) waitIdle(base proxy.Stats, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		st, leaks := s.Snapshot(), s.Leaks()
		if st.SendInUse == 0 && st.RecvInUse == 0 && st.Transfers == 0 && st.PeerMappings == 0 &&
			st.Regions == base.Regions && st.Mappings == base.Mappings && leaks == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proxytest: sidecar %s not idle after %v: send slots %d, recv slots %d, transfers %d, regions %d (was %d), mappings %d (was %d), peer mappings %d; %s",
				s.Name, timeout, st.SendInUse, st.RecvInUse, st.Transfers, st.Regions, base.Regions, st.Mappings, base.Mappings, st.PeerMappings, leaks)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// NoLeaks notes the process's goroutines and open fds now; when the test
// ends, after every cleanup registered later (sidecars closed, caches
// freed), there must be no goroutine that was not there now and no more
// fds. Call it before starting anything the test should release.
func NoLeaks(t testing.TB) {
	t.Helper()
	ignore, before := goleak.IgnoreCurrent(), openFDs(t)
	t.Cleanup(func() {
		if err := goleak.Find(ignore); err != nil {
			t.Errorf("proxytest: goroutines left when the test ended: %v", err)
		}
		deadline := time.Now().Add(idleTimeout)
		for now := openFDs(t); len(now) > len(before); now = openFDs(t) {
			if time.Now().After(deadline) {
				t.Errorf("proxytest: %d fds open when the test ended, %d before it; new: %v", len(now), len(before), newFDs(before, now))
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// openFDs maps the process's open fds to what they are open on.
func openFDs(t testing.TB) map[string]string {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("proxytest: list fds: %v", err)
	}
	m := make(map[string]string, len(ents))
	for _, e := range ents {
		m[e.Name()], _ = os.Readlink("/proc/self/fd/" + e.Name())
	}
	return m
}

// newFDs lists the fds of now that before did not have, or had open on
// something else.
func newFDs(before, now map[string]string) []string {
	var out []string
	for fd, what := range now {
		if before[fd] != what {
			out = append(out, fd+" -> "+what)
		}
	}
	sort.Strings(out)
	return out
}
