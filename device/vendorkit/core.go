package vendorkit

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/stage-kv/stage/device"
)

// Core is the part of a vendor Device every backend has: its name for
// errors, whether it is closed, its lock and the counts of what is open on
// it. A backend's Device embeds it and calls Init before use.
type Core struct {
	vendor  string
	ordinal int
	closed  atomic.Bool

	// Mu guards the counts below and the backend's own tables.
	Mu       sync.Mutex
	Streams  int
	Events   int
	Mappings int // device.Mapping values not yet closed
}

// Init names the device: vendor ("acl", "cuda", "hip") and the ordinal as
// the runtime numbers it in this process.
func (c *Core) Init(vendor string, ordinal int) { c.vendor, c.ordinal = vendor, ordinal }

// Ordinal returns the device's ordinal as the runtime numbers it in this
// process.
func (c *Core) Ordinal() int { return c.ordinal }

// String returns "vendor:N", e.g. "acl:0".
func (c *Core) String() string { return c.vendor + ":" + strconv.Itoa(c.ordinal) }

// IsClosed reports whether Close ran.
func (c *Core) IsClosed() bool { return c.closed.Load() }

// Errorf is an error of this device: "vendor: vendor:N: " and the rest.
func (c *Core) Errorf(format string, args ...any) error {
	return fmt.Errorf("%s: %s: "+format, append([]any{c.vendor, c.String()}, args...)...)
}

// ErrClosed is op's error on a closed device (or a closed object of it),
// wrapping device.ErrClosed.
func (c *Core) ErrClosed(op string) error { return c.Errorf("%s: %w", op, device.ErrClosed) }

// Check returns ErrClosed(op) once the device is closed, else nil.
func (c *Core) Check(op string) error {
	if c.closed.Load() {
		return c.ErrClosed(op)
	}
	return nil
}

// Count adds delta to *n, one of the counts, under Mu.
func (c *Core) Count(n *int, delta int) {
	c.Mu.Lock()
	*n += delta
	c.Mu.Unlock()
}

// Shut marks the device closed and returns what open says is still open
// (called under Mu), or ErrClosed("Close") when it was closed already.
// Every later call on the device or its objects fails with ErrClosed.
func (c *Core) Shut(open func() string) (string, error) {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	if c.closed.Load() {
		return "", c.ErrClosed("Close")
	}
	c.closed.Store(true)
	return open(), nil
}

// Leaked is Close's error for what Shut found still open ("" : nil).
func (c *Core) Leaked(open string) error {
	if open == "" {
		return nil
	}
	return c.Errorf("Close with resources still open: %s", open)
}

// Item is a count of one kind of thing left open, with its word for one
// and for many.
type Item struct {
	N         int
	One, Many string
}

// Open says what items are open, e.g. "1 stream, 2 pinned buffers"; zero
// counts are left out.
func Open(items ...Item) string {
	var parts []string
	for _, it := range items {
		switch {
		case it.N == 1:
			parts = append(parts, "1 "+it.One)
		case it.N > 1:
			parts = append(parts, strconv.Itoa(it.N)+" "+it.Many)
		}
	}
	return strings.Join(parts, ", ")
}

// Positive refuses a size that is not positive for op ("AllocPinned(0):
// size must be positive"), then a closed device.
func Positive[N int | uint64](c *Core, op string, n N) error {
	if n <= 0 {
		return c.Errorf("%s(%d): size must be positive", op, n)
	}
	return c.Check(op)
}
