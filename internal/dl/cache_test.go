package dl

import (
	"errors"
	"testing"
)

func TestCache(t *testing.T) {
	type lib struct{ path string }
	var c Cache[*lib]
	opens := map[string]int{}
	fail := true
	open := func(p string) (*lib, error) {
		opens[p]++
		if p == "flaky" && fail {
			return nil, errors.New("not there yet")
		}
		return &lib{p}, nil
	}
	a, err := c.Get("a", open)
	if err != nil || a.path != "a" {
		t.Fatalf("Get(a): got %v, %v", a, err)
	}
	if a2, _ := c.Get("a", open); a2 != a || opens["a"] != 1 {
		t.Errorf("second Get(a): got %p (want %p), %d opens (want 1)", a2, a, opens["a"])
	}
	if _, err := c.Get("flaky", open); err == nil {
		t.Fatal("Get(flaky): got nil error, want the open's")
	}
	fail = false
	if f, err := c.Get("flaky", open); err != nil || f == nil || opens["flaky"] != 2 {
		t.Errorf("Get(flaky) after a failure: got %v, %v after %d opens; a failure must not be remembered", f, err, opens["flaky"])
	}
	c.Forget(a)
	if a3, _ := c.Get("a", open); a3 == a || opens["a"] != 2 {
		t.Errorf("Get(a) after Forget: got the forgotten library back (%d opens)", opens["a"])
	}
}
