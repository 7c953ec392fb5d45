package kvlayout

import (
	"fmt"
	"strings"
)

// DType is the element type of a KV cache. Only its size matters for moving
// rows; the name is checked so that two engines that store different types
// in rows of the same byte width are refused instead of silently mixed.
type DType uint8

// The element types engines use for KV caches today.
const (
	DTypeInvalid DType = iota
	F16
	BF16
	F32
	FP8E4M3
	FP8E5M2
	Int8
	dtypeEnd
)

var dtypeNames = [dtypeEnd]string{
	DTypeInvalid: "invalid",
	F16:          "f16",
	BF16:         "bf16",
	F32:          "f32",
	FP8E4M3:      "fp8_e4m3",
	FP8E5M2:      "fp8_e5m2",
	Int8:         "int8",
}

var dtypeSizes = [dtypeEnd]uint64{F16: 2, BF16: 2, F32: 4, FP8E4M3: 1, FP8E5M2: 1, Int8: 1}

// String gives the lower-case name used in configs, the wire and errors.
func (d DType) String() string {
	if d < dtypeEnd {
		return dtypeNames[d]
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Size is the element size in bytes; 0 for an unknown type.
func (d DType) Size() uint64 {
	if d < dtypeEnd {
		return dtypeSizes[d]
	}
	return 0
}

// Valid reports whether d is one of the known element types.
func (d DType) Valid() bool { return d.Size() != 0 }

// ParseDType reads a dtype name as String writes it.
func ParseDType(s string) (DType, error) {
	for d := F16; d < dtypeEnd; d++ {
		if s == dtypeNames[d] {
			return d, nil
		}
	}
	return DTypeInvalid, fmt.Errorf("kvlayout: parse dtype %q: unknown; want one of %s", s, strings.Join(dtypeNames[F16:], ", "))
}
