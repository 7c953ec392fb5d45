package proxy

import (
	"fmt"
	"testing"
)

// The stream set on its own: attaching in two steps (claim, put), what
// get and load see, and stop letting nothing attach any more.
func TestStreamSet(t *testing.T) {
	live := func() *dataStream { return &dataStream{} }
	gone := func() *dataStream { ds := &dataStream{}; ds.readerDone.Store(true); return ds }
	for _, tc := range []struct {
		name    string
		old     *dataStream // at index 1 before
		stopped bool
		grow    bool // an accepting session
		claim   bool
		put     bool
		load    string // load(dialer), load(accepting) after
	}{
		{"free index", nil, false, false, true, true, "2 0"},
		{"free index, accepting: stripes grow", nil, false, true, true, true, "2 2"},
		{"a stream still reading holds it", live(), false, false, false, false, "2 0"},
		{"a lost stream is replaced", gone(), false, false, true, true, "2 0"},
		{"stopped", nil, true, false, false, false, "2 0"},
		{"stopped between claim and put", nil, false, false, true, false, "2 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var set streamSet
			set.list = make([]*dataStream, 2)
			set.list[1] = tc.old
			if tc.stopped {
				set.stop()
			}
			old, ok := set.claim(1)
			if ok != tc.claim || old != tc.old {
				t.Fatalf("claim: %p %v, want %p %v", old, ok, tc.old, tc.claim)
			}
			if ok && !tc.put { // the session closed meanwhile
				set.stop()
			}
			ds := live()
			if ok { // attach stops at a refused claim
				if got := set.put(1, old, ds, tc.grow); got != tc.put {
					t.Fatalf("put: %v, want %v", got, tc.put)
				}
			}
			want := tc.old
			if tc.put {
				want = ds
			}
			if tc.stopped || !tc.put && tc.claim {
				want = nil // closed: get gives nothing
			}
			if got := set.get(1); got != want {
				t.Fatalf("get(1) = %p, want %p", got, want)
			}
			if got := fmt.Sprint(set.load(true), set.load(false)); got != tc.load {
				t.Fatalf("load (dialer, accepting) = %s, want %s", got, tc.load)
			}
			if set.get(5) != nil {
				t.Fatal("get out of range gave a stream")
			}
		})
	}
}

// A stream put over another that changed since claim is refused.
func TestStreamSetPutRace(t *testing.T) {
	var set streamSet
	set.list = make([]*dataStream, 1)
	old, ok := set.claim(0)
	if !ok {
		t.Fatal("claim of a free index refused")
	}
	first, second := &dataStream{}, &dataStream{}
	if !set.put(0, old, first, false) || set.put(0, old, second, false) {
		t.Fatal("a second put over the same claim was taken")
	}
	if set.get(0) != first || set.up() != 1 || set.quiet() != first {
		t.Fatalf("stream 0 is %p, want the first %p", set.get(0), first)
	}
}
