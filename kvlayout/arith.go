package kvlayout

import "math/bits"

// Overflow-checked arithmetic. Every size in this package is computed from
// numbers a peer or an engine sent, so a product that wraps must be refused,
// never used.

// mul returns a*b and whether it fits in 64 bits.
func mul(a, b uint64) (uint64, bool) {
	hi, lo := bits.Mul64(a, b)
	return lo, hi == 0
}

// add returns a+b and whether it fits in 64 bits.
func add(a, b uint64) (uint64, bool) {
	s, c := bits.Add64(a, b, 0)
	return s, c == 0
}

// span is the byte distance from the first to the last element of a
// dimension of count items spaced stride apart: (count-1)*stride, 0 for
// count <= 1.
func span(count, stride uint64) (uint64, bool) {
	if count <= 1 {
		return 0, true
	}
	return mul(count-1, stride)
}
