package device

// Optional capabilities of the same-node paths. A backend that lacks one
// makes the sidecar fall back to staging over TCP (counted, with a reason).

// DtoD is implemented by Streams that copy device to device: inside one
// device, between two devices of this node, or into and out of memory
// imported from another process (an IPC handle, a POSIX fd, a memfd).
type DtoD interface {
	// CopyDtoD enqueues a copy of n bytes from src to dst.
	CopyDtoD(dst, src Addr, n uint64) error
}

// Copy is one copy of a batch: Len bytes from Src to Dst.
type Copy struct {
	Dst, Src Addr
	Len      uint64
}

// DtoDBatch is implemented by Streams that enqueue many device-to-device
// copies at once (one kernel launch or one batched call per few hundred)
// far cheaper than one CopyDtoD each: what scattered KV blocks need.
type DtoDBatch interface {
	// CopyDtoDBatch enqueues cs in order; cs may be reused when it returns.
	CopyDtoDBatch(cs []Copy) error
}

// HostRegisterer is implemented by Devices that can pin host memory the
// caller mapped (a memfd shared with another sidecar) and give it a device
// view, so that Gather and Scatter can use it like an AllocPinned buffer.
type HostRegisterer interface {
	// RegisterHost pins b (which must stay mapped until UnregisterHost).
	RegisterHost(b []byte) (Pinned, error)
	// UnregisterHost undoes RegisterHost; pass what it returned.
	UnregisterHost(p Pinned) error
}

// SlotRenewer is implemented by Devices whose pinned send slots can be given
// fresh physical pages at the same address. A slot written to a socket with
// vmsplice+splice is referenced by the kernel, not copied: until the peer
// proved it read the bytes, its pages may still be queued in socket buffers.
// A slot given up without that proof (stream lost, transfer failed) must not
// be written again; renewing it leaves the old pages to the kernel, which
// frees them once the socket lets go, and hands the slot new ones.
type SlotRenewer interface {
	// AllocSlots allocates n pinned slots of size bytes each (size a
	// multiple of the page size), each pinned on its own so that one can
	// be renewed while the others are in use.
	AllocSlots(size, n int) ([]Pinned, error)
	// RenewSlot replaces the pages of slot (whole, as AllocSlots or an
	// earlier RenewSlot returned it) with fresh zeroed ones at the same
	// host address and returns its views (the device view may move). No
	// copy may be in flight on the slot. On error the slot must not be used
	// again; FreeSlots still frees it.
	RenewSlot(slot Pinned) (Pinned, error)
	// FreeSlots frees what AllocSlots returned: pass every slot, as last
	// renewed.
	FreeSlots(slots []Pinned) error
}
