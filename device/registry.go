package device

import (
	"fmt"
	"sort"
	"sync"
)

// Options carries the settings of the backend being opened, from the
// config's device section. Each backend owns the type of its settings
// (hostmem.Config, cuda.Config, acl.Config, hip.Config), so this package
// knows none of them: Backend holds a value of that type, and nil means the
// backend's defaults.
type Options struct {
	Backend any
}

// BackendConfig returns o.Backend as backend k's settings type T: the zero
// T when o carries none, an error when it carries another backend's.
func BackendConfig[T any](o Options, k Kind) (T, error) {
	var zero T
	if o.Backend == nil {
		return zero, nil
	}
	c, ok := o.Backend.(T)
	if !ok {
		return zero, fmt.Errorf("device: backend %s: settings of type %T, want %T", k, o.Backend, zero)
	}
	return c, nil
}

// OpenAs is a backend's Opener written once: it unpacks opts.Backend as
// the backend's settings type T and opens ordinal with open, returning a
// nil Device (never a nil *D inside the interface) when that fails.
func OpenAs[T any, D Device](k Kind, ordinal int, opts Options, open func(int, T) (D, error)) (Device, error) {
	cfg, err := BackendConfig[T](opts, k)
	if err != nil {
		return nil, err
	}
	d, err := open(ordinal, cfg)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Opener opens device ordinal of one backend.
type Opener func(ordinal int, opts Options) (Device, error)

// Backend is what a backend registers: how to open it, and which optional
// interfaces of this package its values implement, so that a reader (and
// stagectl, and logs) can see that without grepping for type assertions.
type Backend struct {
	Open Opener
	// Caps declares the optional interfaces the backend's Devices and
	// Streams implement. The test in capability_test.go holds it against
	// Device and Stream with the real type assertions (Implements).
	Caps []Capability
	// Device and Stream are values of the backend's concrete types (nil
	// pointers will do) for that check; nothing calls their methods.
	Device Device
	Stream Stream
}

var (
	mu       sync.Mutex
	backends = map[Kind]Backend{}
)

// Register makes a backend available to Open. Backends call it from init.
func Register(k Kind, b Backend) {
	mu.Lock()
	defer mu.Unlock()
	backends[k] = b
}

// Lookup returns what backend k registered.
func Lookup(k Kind) (Backend, bool) {
	mu.Lock()
	defer mu.Unlock()
	b, ok := backends[k]
	return b, ok
}

// Open opens device ordinal of backend k.
func Open(k Kind, ordinal int, opts Options) (Device, error) {
	b, ok := Lookup(k)
	if !ok {
		return nil, fmt.Errorf("device: backend %q is not built into this binary (have %v)", k, Kinds())
	}
	return b.Open(ordinal, opts)
}

// Kinds lists the registered backends.
func Kinds() []Kind {
	mu.Lock()
	defer mu.Unlock()
	ks := make([]Kind, 0, len(backends))
	for k := range backends {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}
