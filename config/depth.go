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
// It is written "auto" in YAML, env vars and flags.
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
// Validate's). DepthAuto's own value is not accepted as a number: -1 in a
// file is a mistake, not a way to say auto.
func toDepth(data any) (any, error) {
	const want = "must be auto or a whole number >= 0"
	switch v := data.(type) {
	case Depth:
		return v, nil
	case string:
		s := strings.TrimSpace(v)
		if strings.EqualFold(s, "auto") {
			return DepthAuto, nil
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return nil, badValue(want)
		}
		return Depth(n), nil
	}
	rv := reflect.ValueOf(data)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if n := rv.Int(); n >= 0 && n <= math.MaxInt32 {
			return Depth(n), nil
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n := rv.Uint(); n <= math.MaxInt32 {
			return Depth(n), nil
		}
	case reflect.Float32, reflect.Float64:
		if f := rv.Float(); f == math.Trunc(f) && f >= 0 && f <= math.MaxInt32 {
			return Depth(f), nil
		}
	}
	return nil, badValue(want)
}
