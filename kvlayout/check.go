package kvlayout

import (
	"errors"
	"fmt"
)

// ErrMismatch is wrapped by Check's refusals: the two layouts describe
// different logical KV, and no conversion makes one into the other.
var ErrMismatch = errors.New("kv layout mismatch")

// Check says whether rows can move between layout a (here) and layout b
// (the peer) before any byte moves: the same dtype, the same logical row
// width, the same total kv heads, and head slices that share at least one
// head. Block sizes, strides and the split of the row into parts may
// differ. The error names both sides' values.
func Check(a, b Layout) error {
	mismatch := func(what string, here, peer any) error {
		return fmt.Errorf("%w: %s %v here, %v at the peer", ErrMismatch, what, here, peer)
	}
	switch wa, wb := a.RowWidth(), b.RowWidth(); {
	case a.DType != b.DType:
		return mismatch("dtype", a.DType, b.DType)
	case wa != wb:
		return mismatch("row width (elements)", wa, wb)
	case a.Heads != b.Heads:
		return mismatch("total kv heads", a.Heads, b.Heads)
	}
	if lo, hi := Overlap(a, b); lo >= hi {
		return fmt.Errorf("%w: head slices [%d, %d) here and [%d, %d) at the peer share no head", ErrMismatch, a.HeadLo, a.HeadHi, b.HeadLo, b.HeadHi)
	}
	return nil
}

// Overlap is the intersection of the two layouts' head slices; empty
// (lo >= hi) when they share no head.
func Overlap(a, b Layout) (lo, hi uint32) {
	return max(a.HeadLo, b.HeadLo), min(a.HeadHi, b.HeadHi)
}

// Col is a range [Lo, Hi) of elements of the logical row that lies inside
// one part on both sides of a transfer.
type Col struct {
	Lo, Hi uint32
}

// Columns cuts the logical row at the union of both layouts' part
// boundaries, so that each column lies inside one part of each: 576
// against 512+64 gives [0,512) and [512,576). It returns nil when the row
// widths differ (Check refuses those).
func Columns(a, b Layout) []Col {
	w := a.RowWidth()
	if w != b.RowWidth() || w == 0 {
		return nil
	}
	cols := make([]Col, 0, len(a.Parts)+len(b.Parts))
	var i, j int
	var ea, eb, lo uint64 = 0, 0, 0 // ends of the current parts
	for lo < w {
		for ea <= lo && i < len(a.Parts) {
			ea += uint64(a.Parts[i].Width)
			i++
		}
		for eb <= lo && j < len(b.Parts) {
			eb += uint64(b.Parts[j].Width)
			j++
		}
		hi := min(ea, eb)
		cols = append(cols, Col{uint32(lo), uint32(hi)})
		lo = hi
	}
	return cols
}
