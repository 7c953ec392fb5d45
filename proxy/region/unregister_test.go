package region

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeDev imports host-address handles and counts the mappings it opened
// and closed; closeErr, when set, is what closing one says.
type fakeDev struct {
	device.Device // only String and Import are called
	mu            sync.Mutex
	opened        int
	closed        int
	closeErr      error
}

func (d *fakeDev) String() string { return "fake:0" }

func (d *fakeDev) Import(h device.Handle) (device.Mapping, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.opened++
	return &countedMapping{d: d, base: device.Addr(h.Addr), size: h.Size}, nil
}

func (d *fakeDev) counts() (opened, closed int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.opened, d.closed
}

// countedMapping is a fakeDev's import; Close counts.
type countedMapping struct {
	d    *fakeDev
	base device.Addr
	size uint64
}

func (m *countedMapping) Base() device.Addr { return m.base }
func (m *countedMapping) Size() uint64      { return m.size }
func (m *countedMapping) Close() error {
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	m.d.closed++
	return m.d.closeErr
}

// alloc is one fake allocation: regions registered with it share an import.
var alloc = device.Handle{Kind: device.HandleHostAddr, Addr: 0x10000, Size: 1 << 20}

// newTable is a table on a fake device with regions a and b (one
// allocation) and c (another), and the revocations it heard of.
func newTable(t *testing.T) (*Table, *fakeDev, *[]string) {
	t.Helper()
	d := &fakeDev{}
	var mu sync.Mutex
	revoked := []string{}
	tb := NewTable(d, func(r *Region) {
		mu.Lock()
		revoked = append(revoked, r.Name)
		mu.Unlock()
	})
	other := alloc
	other.Addr = 0x900000
	for _, r := range []struct {
		name string
		h    device.Handle
		off  uint64
	}{{"a", alloc, 0}, {"b", alloc, 4096}, {"c", other, 0}} {
		if err := tb.Register(eng, r.name, r.h, wire.AccessAll, r.off, 4096); err != nil {
			t.Fatal(err)
		}
	}
	return tb, d, &revoked
}

func wantCode(t *testing.T, what string, err error, code wire.Code, text string) {
	t.Helper()
	if err == nil || status.Code(err) != code || !strings.Contains(err.Error(), text) {
		t.Fatalf("%s: got %v (code %v), want code %v mentioning %q", what, err, status.Code(err), code, text)
	}
}

// TestUnregisterWaitUnheld: a region no transfer holds goes at once; the
// import closes with the last region of its allocation, not before.
func TestUnregisterWaitUnheld(t *testing.T) {
	tb, d, revoked := newTable(t)
	for _, step := range []struct {
		name         string
		wantRegions  int
		wantMappings int
		wantClosed   int
	}{
		{"a", 2, 2, 0}, // b still uses the allocation
		{"b", 1, 1, 1}, // the last region of it: closed
		{"c", 0, 0, 2},
	} {
		if err := tb.UnregisterWait(eng.Group, step.name, time.Second, nil); err != nil {
			t.Fatalf("UnregisterWait(%s): got %v, want nil", step.name, err)
		}
		regions, mappings := tb.Count()
		_, closed := d.counts()
		if regions != step.wantRegions || mappings != step.wantMappings || closed != step.wantClosed {
			t.Fatalf("after UnregisterWait(%s): got %d regions, %d mappings, %d closed; want %d, %d, %d",
				step.name, regions, mappings, closed, step.wantRegions, step.wantMappings, step.wantClosed)
		}
	}
	// Once when each wait began, once when its region was released.
	if got := strings.Join(*revoked, ","); got != "a,a,b,b,c,c" {
		t.Fatalf("onUnregister heard %q, want a,a,b,b,c,c", got)
	}
	wantCode(t, "again", tb.UnregisterWait(eng.Group, "a", time.Second, nil), wire.CodeUnknownRegion, `region "a" is not registered`)
}

// TestUnregisterWaitAnswersAfterRelease: the answer comes once the last
// transfer let go, with the import closed by then; meanwhile the region
// refuses new transfers, a second Unregister and its name's Register.
func TestUnregisterWaitAnswersAfterRelease(t *testing.T) {
	tb, d, _ := newTable(t)
	if err := tb.Unregister(eng.Group, "a"); err != nil { // b is now the allocation's only region
		t.Fatal(err)
	}
	held, err := tb.Acquire("b", wire.AccessLocalRead)
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		err    error
		closed int
	}
	done := make(chan answer, 1)
	go func() {
		err := tb.UnregisterWait(eng.Group, "b", 10*time.Second, nil)
		_, closed := d.counts()
		done <- answer{err, closed}
	}()
	waitFor(t, func() bool {
		tb.mu.RLock()
		defer tb.mu.RUnlock()
		return tb.byName["b"].closing
	})
	_, err = tb.Acquire("b", wire.AccessLocalRead)
	wantCode(t, "Acquire while closing", err, wire.CodeUnknownRegion, "is being unregistered")
	wantCode(t, "Unregister while closing", tb.Unregister(eng.Group, "b"), wire.CodeBusy, "already waiting")
	wantCode(t, "UnregisterWait while closing", tb.UnregisterWait(eng.Group, "b", time.Second, nil), wire.CodeBusy, "already waiting")
	wantCode(t, "Register while closing", tb.Register(eng, "b", alloc, wire.AccessAll, 0, 1), wire.CodeExists, "already registered")
	select {
	case a := <-done:
		t.Fatalf("UnregisterWait answered %v while a transfer held the region", a.err)
	case <-time.After(50 * time.Millisecond):
	}
	if _, closed := d.counts(); closed != 0 {
		t.Fatalf("import closed %d times under a transfer, want 0", closed)
	}
	held.Release()
	a := <-done
	if a.err != nil || a.closed != 1 {
		t.Fatalf("after the release: got %v with %d imports closed, want nil and 1 closed", a.err, a.closed)
	}
	if regions, mappings := tb.Count(); regions != 1 || mappings != 1 {
		t.Fatalf("got %d regions, %d mappings; want c left: 1, 1", regions, mappings)
	}
	if err := tb.Register(eng, "b", alloc, wire.AccessAll, 0, 1); err != nil {
		t.Fatalf("Register of the name again: %v", err)
	}
}

// TestUnregisterWaitGivesUp: a region still held when the wait ends, or
// when the caller cancels, stays registered and usable; a table closed
// under the waiter says so; a failed close of the import is reported.
func TestUnregisterWaitGivesUp(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cancel   bool
		closeAll bool
		code     wire.Code
		text     string
	}{
		{"timeout", false, false, wire.CodeBusy, `region "b": 1 transfer(s) still use it after 30ms; it stays registered`},
		{"cancelled", true, false, wire.CodeCancelled, "it stays registered"},
		{"table closed", false, true, wire.CodeShutdown, "shutting down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, d, _ := newTable(t)
			held, err := tb.Acquire("b", wire.AccessLocalRead)
			if err != nil {
				t.Fatal(err)
			}
			cancel := make(chan struct{})
			wait := 30 * time.Millisecond
			if tc.cancel || tc.closeAll {
				wait = 10 * time.Second
			}
			done := make(chan error, 1)
			go func() { done <- tb.UnregisterWait(eng.Group, "b", wait, cancel) }()
			waitFor(t, func() bool {
				tb.mu.RLock()
				defer tb.mu.RUnlock()
				r := tb.byName["b"]
				return r == nil || r.closing
			})
			switch {
			case tc.cancel:
				close(cancel)
			case tc.closeAll:
				tb.CloseAll()
				close(cancel) // the server's engines go first at shutdown
			}
			wantCode(t, "UnregisterWait", <-done, tc.code, tc.text)
			if tc.closeAll {
				held.Release()
				if _, closed := d.counts(); closed != 2 {
					t.Fatalf("after CloseAll and the last release: %d imports closed, want 2", closed)
				}
				return
			}
			// Still registered, usable, and unregistered as usual later.
			again, err := tb.Acquire("b", wire.AccessLocalRead)
			if err != nil {
				t.Fatalf("Acquire after giving up: %v", err)
			}
			again.Release()
			held.Release()
			if _, closed := d.counts(); closed != 0 {
				t.Fatalf("import closed %d times, want 0 (a still uses it)", closed)
			}
			for _, n := range []string{"a", "b"} {
				if err := tb.UnregisterWait(eng.Group, n, time.Second, nil); err != nil {
					t.Fatalf("UnregisterWait(%s) later: %v", n, err)
				}
			}
			if _, closed := d.counts(); closed != 1 {
				t.Fatalf("import closed %d times, want 1", closed)
			}
			tb.CloseAll()
		})
	}
}

func TestUnregisterWaitCloseError(t *testing.T) {
	tb, d, _ := newTable(t)
	d.closeErr = errors.New("cuIpcCloseMemHandle: CUDA_ERROR_INVALID_VALUE")
	err := tb.UnregisterWait(eng.Group, "c", time.Second, nil)
	wantCode(t, "UnregisterWait", err, wire.CodeDevice, "do not free the memory")
	if !errors.Is(err, d.closeErr) {
		t.Fatalf("got %v, want it to wrap the close error", err)
	}
	if regions, _ := tb.Count(); regions != 2 {
		t.Fatalf("got %d regions, want 2 (c is gone all the same)", regions)
	}
	tb.CloseAll()
}

// TestUnregisterWaitRace: transfers come and go while short waits give up
// and retry; the region ends either registered and usable or gone with its
// import closed, never in between (run with -race).
func TestUnregisterWaitRace(t *testing.T) {
	tb, d, _ := newTable(t)
	if err := tb.Unregister(eng.Group, "a"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if r, err := tb.Acquire("b", wire.AccessLocalRead); err == nil {
					time.Sleep(100 * time.Microsecond)
					r.Release()
				}
			}
		}()
	}
	var err error
	for range 200 {
		err = tb.UnregisterWait(eng.Group, "b", 200*time.Microsecond, nil)
		if err == nil {
			break
		}
		if c := status.Code(err); c != wire.CodeBusy {
			t.Fatalf("UnregisterWait: got %v, want nil or busy", err)
		}
	}
	close(stop)
	wg.Wait()
	_, closed := d.counts()
	regions, _ := tb.Count()
	switch {
	case err == nil && (closed != 1 || regions != 1):
		t.Fatalf("gone: got %d imports closed, %d regions; want 1, 1", closed, regions)
	case err != nil && (closed != 0 || regions != 2):
		t.Fatalf("kept: got %d imports closed, %d regions; want 0, 2", closed, regions)
	}
	tb.CloseAll()
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}
