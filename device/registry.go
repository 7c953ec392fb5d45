package device

import (
	"fmt"
	"sort"
	"sync"
)

// Options carries backend-specific settings from the config (the
// device.* keys); each backend reads its own part and ignores the rest.
// The zero value means every backend's defaults.
type Options struct {
	// Hostmem models: 0 means as fast as memmove.
	BandwidthBytesPerSec float64
	LatencyNanos         int64

	CUDA CUDAOptions
	ACL  ACLOptions
	HIP  HIPOptions
}

// CUDAOptions are the cuda backend's settings (device.cuda.*). Empty
// strings mean the defaults.
type CUDAOptions struct {
	Library   string // driver library path or name; "": libcuda.so.1
	CopyMode  string // auto | kernel | batch | percopy
	EventWait string // auto | spin | block | hybrid
	PTX       string // file replacing the embedded copy kernel module; "": the embedded one
}

// ACLOptions are the acl backend's settings (device.acl.*). Empty strings
// mean the defaults.
type ACLOptions struct {
	Library  string // runtime library path or name; "": libascendcl.so
	CopyMode string // auto | batch | pack | percopy
}

// HIPOptions are the hip backend's settings (device.hip.*). Empty strings
// mean the defaults.
type HIPOptions struct {
	Library string // runtime library path or name; "": libamdhip64.so
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
