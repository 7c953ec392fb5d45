package vendorkit

import (
	"errors"
	"strings"
	"testing"

	"github.com/stage-kv/stage/device"
)

func newCore(t *testing.T) *Core {
	t.Helper()
	c := &Core{}
	c.Init("acl", 3)
	return c
}

func TestCoreNamesAndCloses(t *testing.T) {
	c := newCore(t)
	if c.String() != "acl:3" || c.Ordinal() != 3 {
		t.Fatalf("String %q, Ordinal %d: want acl:3, 3", c.String(), c.Ordinal())
	}
	if err := c.Errorf("AllocPinned(%d): %s", 5, "why"); err.Error() != "acl: acl:3: AllocPinned(5): why" {
		t.Errorf("Errorf: %q", err)
	}
	if err := c.Check("Op"); err != nil {
		t.Errorf("Check on an open device: %v", err)
	}
	c.Count(&c.Streams, 1)
	c.Count(&c.Events, 2)
	open := func() string {
		return Open(Item{N: c.Streams, One: "stream", Many: "streams"}, Item{N: c.Events, One: "event", Many: "events"},
			Item{N: c.Mappings, One: "mapping", Many: "mappings"})
	}
	leaks, err := c.Shut(open)
	if err != nil || leaks != "1 stream, 2 events" {
		t.Fatalf("Shut: %q, %v; want \"1 stream, 2 events\"", leaks, err)
	}
	if err := c.Leaked(leaks); err == nil || err.Error() != "acl: acl:3: Close with resources still open: 1 stream, 2 events" {
		t.Errorf("Leaked: %v", err)
	}
	if err := c.Leaked(""); err != nil {
		t.Errorf("Leaked(\"\"): %v", err)
	}
	if _, err := c.Shut(open); !errors.Is(err, device.ErrClosed) || !strings.Contains(err.Error(), "acl:3: Close:") {
		t.Errorf("second Shut: %v, want ErrClosed naming Close", err)
	}
	if err := c.Check("Import"); !errors.Is(err, device.ErrClosed) || err.Error() != "acl: acl:3: Import: "+device.ErrClosed.Error() {
		t.Errorf("Check on a closed device: %v", err)
	}
}

func TestPositive(t *testing.T) {
	c := newCore(t)
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"int zero", Positive(c, "AllocPinned", 0), "acl: acl:3: AllocPinned(0): size must be positive"},
		{"int negative", Positive(c, "AllocPinned", -4), "acl: acl:3: AllocPinned(-4): size must be positive"},
		{"uint64 zero", Positive(c, "AllocDevice", uint64(0)), "acl: acl:3: AllocDevice(0): size must be positive"},
		{"positive", Positive(c, "AllocDevice", uint64(1)), ""},
	} {
		got := ""
		if tc.err != nil {
			got = tc.err.Error()
		}
		if got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	c.Shut(func() string { return "" })
	if err := Positive(c, "AllocPinned", 8); !errors.Is(err, device.ErrClosed) {
		t.Errorf("Positive on a closed device: %v", err)
	}
}

func TestOpen(t *testing.T) {
	for _, tc := range []struct {
		items []Item
		want  string
	}{
		{nil, ""},
		{[]Item{{N: 0, One: "stream", Many: "streams"}}, ""},
		{[]Item{{N: 1, One: "stream", Many: "streams"}, {N: 0, One: "event", Many: "events"}, {N: 3, One: "mapping", Many: "mappings"}}, "1 stream, 3 mappings"},
		{[]Item{{N: 1, One: "stream(s)", Many: "stream(s)"}, {N: 2, One: "pinned buffer(s)", Many: "pinned buffer(s)"}}, "1 stream(s), 2 pinned buffer(s)"},
	} {
		if got := Open(tc.items...); got != tc.want {
			t.Errorf("Open(%v) = %q, want %q", tc.items, got, tc.want)
		}
	}
}
