// Package kvlayout maps a KV cache between the layouts engines store it in
// and one canonical byte order on the wire, so that prefill on one engine
// and decode on another (other block size, other tensor-parallel split,
// K and V apart or packed, MLA's 576 against 512+64) receive the same
// logical rows. docs/KVLAYOUT.md describes the model.
//
// What it does: describe one layer of an engine's cache (Layout: parts,
// strides, block size, dtype, heads and the slice this rank holds), built
// from presets (Preset) or from a tensor's shape and strides (FromStrides),
// and check it (Validate); decide whether two layouts can meet (Check) and
// where their rows are cut (Columns); for one side of a transfer (NewSide)
// map any range of the canonical stream to that side's memory segments
// (Segments), coalescing rows contiguous in its memory; and copy in Go
// (Gather, Scatter) for hostmem and tests.
//
// What it never does: no I/O, no goroutines, no device calls, no imports
// of stage's other packages. Neither side needs the other's strides: a
// side maps only its own layout to the canonical order.
//
// Ownership: a Side keeps the block table and regions it was given (no
// copy) and never changes them; the caller must leave them alone while the
// Side is in use. Segments allocates nothing; the emit function must not
// keep the Side's arguments past its return.
package kvlayout
