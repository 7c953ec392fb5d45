package proxy

import (
	"testing"

	"github.com/stage-kv/stage/staging"
)

func TestXferTableForgetsOldestFinished(t *testing.T) {
	var tab = newXferTable()
	for id := uint64(1); id <= maxFinished+2; id++ {
		tab.add(&localXfer{id: id, done: make(chan struct{})})
		tab.finish(id)
	}
	for _, tt := range []struct {
		id   uint64
		want bool
	}{{1, false}, {2, false}, {3, true}, {maxFinished + 2, true}, {maxFinished + 3, false}} {
		if got := tab.get(tt.id) != nil; got != tt.want {
			t.Errorf("get(%d) found: got %v, want %v", tt.id, got, tt.want)
		}
	}
	if n := len(tab.all()); n != maxFinished {
		t.Errorf("all: got %d transfers, want %d", n, maxFinished)
	}
}

func TestXferTableRunning(t *testing.T) {
	a, b := &session{}, &session{}
	done := make(chan struct{})
	close(done)
	tab := newXferTable()
	for i, x := range []struct {
		ss       *session
		finished bool
	}{{a, false}, {a, true}, {b, false}, {b, false}} {
		lx := &localXfer{id: uint64(i + 1), ss: x.ss, done: make(chan struct{})}
		if x.finished {
			lx.done = done
		}
		tab.add(lx)
	}
	for _, tt := range []struct {
		name string
		ss   *session
		want int
	}{{"a", a, 1}, {"b", b, 2}, {"any", nil, 3}} {
		if got := tab.running(tt.ss); got != tt.want {
			t.Errorf("running(%s): got %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestOutTable(t *testing.T) {
	a, b := &session{}, &session{}
	push := &localXfer{id: 1, done: make(chan struct{})}
	tab := newOutTable()
	tab.put(&outXfer{key: 1, ss: a, end: ourPush{push}}) // our push
	tab.put(&outXfer{key: 2, ss: a, end: servedPull{}})  // pulls we serve
	tab.put(&outXfer{key: 3, ss: a, end: servedPull{}})
	tab.put(&outXfer{key: 4, ss: b, end: servedPull{}})
	if got := tab.served(a); got != 2 {
		t.Errorf("served(a): got %d, want 2", got)
	}
	tab.progress([]staging.Progress{{Transfer: 1, Bytes: 100}, {Transfer: 2, Bytes: 50}, {Transfer: 9, Bytes: 1}})
	if got := push.doneB.Load(); got != 100 {
		t.Errorf("push progress: got %d B, want 100", got)
	}
	if ox := tab.take(2); ox == nil || ox.key != 2 {
		t.Fatalf("take(2): got %v, want the transfer of key 2", ox)
	}
	if tab.get(2) != nil || tab.take(2) != nil {
		t.Error("key 2 still there after take")
	}
	if all := tab.takeAll(); len(all) != 3 || tab.len() != 0 {
		t.Errorf("takeAll: got %d, %d left; want 3, 0 left", len(all), tab.len())
	}
}
