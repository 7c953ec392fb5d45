package config

import (
	"math"
	"reflect"
	"strconv"
	"strings"
)

// Depth is staging.stream_depth: chunks gathered ahead of the socket per
// data stream, or DepthAuto.
type Depth int

// DepthAuto lets the sidecar choose the depth from how it sends (Resolve).
// It is written "auto" in YAML and env vars.
const DepthAuto Depth = -1

// Depths chosen by DepthAuto, measured in docs/BENCHMARKS.md ("Stream
// depth, slot renewals, slot reuse"): with writev a chunk copied just
// before the kernel copies it again may still be in the CPU's cache, and
// depth 3 used 7-25% more CPU per GB than 1 on the H100; with splice send
// the sending side copies nothing, and depth 3 moved scattered blocks
// 6-19% faster than 1, because with 1 a stream idles while its next chunk
// is gathered.
const (
	DepthWritev Depth = 1
	DepthSplice Depth = 3
)

// Resolve is the depth to use: d itself, or for DepthAuto the one for the
// send mode (splice: chunks sent by vmsplice+splice).
func (d Depth) Resolve(splice bool) int {
	if d != DepthAuto {
		return int(d)
	}
	if splice {
		return int(DepthSplice)
	}
	return int(DepthWritev)
}

func (d Depth) String() string {
	if d == DepthAuto {
		return "auto"
	}
	return strconv.Itoa(int(d))
}

// toDepth reads "auto" or a whole number >= 0 (the upper bound is
// Validate's); numbers go through decodeHook's integer rules (strings from
// env vars, whole floats). DepthAuto's own value is not accepted as a
// number: -1 in a file is a mistake, not a way to say auto.
func toDepth(data any) (any, error) {
	const want = "must be auto or a whole number >= 0"
	if s, ok := data.(string); ok && strings.EqualFold(strings.TrimSpace(s), "auto") {
		return DepthAuto, nil
	}
	v, err := decodeHook(nil, intType, data)
	if err != nil {
		return nil, badValue(want)
	}
	if n := reflect.ValueOf(v); n.CanInt() && n.Int() >= 0 && n.Int() <= math.MaxInt32 {
		return Depth(n.Int()), nil
	}
	return nil, badValue(want)
}
