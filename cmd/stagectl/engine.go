package main

import (
	"fmt"
	"strconv"
	"strings"

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
var cudaDevs = map[int]*cuda.Device{}

// newCache allocates a cache's memory where d says.
func newCache(d engineDevice, name string, layers int, layerBytes, guard uint64) (*kvsim.Cache, error) {
	if d.kind == "hostmem" {
		return kvsim.New(name, layers, layerBytes, guard)
	}
	dev := cudaDevs[d.ordinal]
	if dev == nil {
		var err error
		if dev, err = cuda.OpenDevice(d.ordinal, cuda.Config{}); err != nil {
			return nil, err
		}
		cudaDevs[d.ordinal] = dev
	}
	m, err := kvsim.NewCUDAMemory(dev, 2*guard+uint64(layers)*layerBytes)
	if err != nil {
		return nil, err
	}
	return kvsim.NewOn(m, name, layers, layerBytes, guard)
}
