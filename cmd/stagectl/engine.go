package main

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/stage-kv/stage/cuda"
	"github.com/stage-kv/stage/kvsim"
)

// engineDevice says where a sidecar's device, and the engine memory
// stagectl registers with it, live: "hostmem" or "cuda:N".
type engineDevice struct {
	kind    string
	ordinal int
}

func parseEngineDevice(s string) (engineDevice, error) {
	kind, ord, _ := strings.Cut(s, ":")
	d := engineDevice{kind: kind}
	if ord != "" {
		n, err := strconv.Atoi(ord)
		if err != nil || n < 0 {
			return d, fmt.Errorf("device %q: ordinal must be a number >= 0", s)
		}
		d.ordinal = n
	}
	switch kind {
	case "hostmem", "cuda":
		return d, nil
	}
	return d, fmt.Errorf("device %q: want hostmem or cuda:N", s)
}

func (d engineDevice) String() string { return fmt.Sprintf("%s:%d", d.kind, d.ordinal) }

// cudaDevs keeps one opened CUDA device per ordinal for this process.
var cudaDevs = struct {
	sync.Mutex
	m map[int]*cuda.Device
}{m: map[int]*cuda.Device{}}

// cudaDevice opens the CUDA device of ordinal once (the benches of one
// process may allocate from several goroutines).
func cudaDevice(ordinal int) (*cuda.Device, error) {
	cudaDevs.Lock()
	defer cudaDevs.Unlock()
	if dev := cudaDevs.m[ordinal]; dev != nil {
		return dev, nil
	}
	dev, err := cuda.OpenDevice(ordinal, cuda.Config{})
	if err != nil {
		return nil, err
	}
	cudaDevs.m[ordinal] = dev
	return dev, nil
}

// newCache allocates a cache's memory where d says.
func newCache(d engineDevice, name string, layers int, layerBytes, guard uint64) (*kvsim.Cache, error) {
	if d.kind == "hostmem" {
		return kvsim.New(name, layers, layerBytes, guard)
	}
	dev, err := cudaDevice(d.ordinal)
	if err != nil {
		return nil, err
	}
	m, err := kvsim.NewCUDAMemory(dev, 2*guard+uint64(layers)*layerBytes)
	if err != nil {
		return nil, err
	}
	return kvsim.NewOn(m, name, layers, layerBytes, guard)
}
