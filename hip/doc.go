// Package hip is stage's AMD backend: it implements device.Device on AMD's
// HIP runtime (libamdhip64.so, ROCm's hip/hip_runtime_api.h), loaded with
// dlopen when a device is first opened, so one stage binary builds without
// ROCm and runs on nodes with or without an AMD GPU. Importing the package
// registers it under device.KindHIP (config: device.kind: hip); nothing is
// loaded at init.
//
// # Status: emulation only
//
// This backend has never run on an AMD GPU, nor against a real
// libamdhip64.so. It is tested only against testdata/fakehip.c, an
// emulation of the calls it binds over host memory, written from the HIP
// documentation. Before trusting it on hardware, check against the
// installed ROCm headers and a GPU:
//
//   - enum values: hipMemcpyKind (H2D 1, D2H 2, D2D 3),
//     hipHostMallocPortable 0x1 / hipHostMallocMapped 0x2,
//     hipStreamNonBlocking 0x1, hipEventDisableTiming 0x2,
//     hipIpcMemLazyEnablePeerAccess 0x1, and the error codes stage reacts
//     to (600 hipErrorNotReady, 704 hipErrorPeerAccessAlreadyEnabled,
//     2 out of memory, 801 not supported);
//   - the IPC handle: 64 bytes, passed BY VALUE to hipIpcOpenMemHandle
//     through the C shim (check the struct size and that the ROCm in use
//     does not export a versioned or differently shaped symbol);
//   - hipMemGetAddressRange on an interior pointer returns the allocation
//     base and size (for hipMalloc memory and for PyTorch's caching
//     allocator blocks), and on an opened IPC mapping returns the mapped
//     base itself;
//   - that hipIpcOpenMemHandle maps the allocation base, that opening a
//     handle in the exporting process works (the fake allows it), that a
//     second open of one handle in a process fails or returns the same
//     pointer (the fake fails; stage opens each once anyway), and that
//     exporters may free only after importers closed;
//   - peer access: that IPC imports from another GPU over XGMI need no
//     hipDeviceEnablePeerAccess beyond the lazy flag, and 704 semantics;
//   - events: that hipEventQuery returns the error of failed work before
//     it (the fake does; the runtime may make errors sticky per device
//     instead), the CPU cost of hipEventSynchronize with DisableTiming (it
//     may spin; hipEventBlockingSync is the alternative), and event reuse;
//   - that hipHostMalloc is still exported (ROCm 6 deprecates it in favour
//     of hipExtHostAlloc) and that copies with the host pointer of MAPPED
//     memory are asynchronous.
//
// # What it binds
//
// OpenLibrary resolves every entry point once into a C struct of function
// pointers (shim.h lists each with its C prototype). Missing required
// symbols fail the open with one error naming the library and all of them;
// hipDeviceEnablePeerAccess is optional and recorded in Absent when
// missing. The library is device.hip.library (Config.Library), by default
// libamdhip64.so. hipInit(0) runs once per Library.
//
// Errors are *Error values: the call with its arguments, the hipError_t,
// and the runtime's hipGetErrorName and hipGetErrorString text. errors.Is
// maps out of memory onto device.ErrOutOfMemory, not supported (and peer
// access unsupported) onto device.ErrNotSupported, hipErrorNotReady onto
// device.ErrNotReady. Ranges past an allocation are ErrOutOfRange.
//
// # Threads
//
// HIP keeps a current device per OS thread, and goroutines move between
// threads. Every trampoline makes the Device's ordinal current on the
// calling thread (hipGetDevice, and hipSetDevice only when it differs) in
// the same cgo call as the operation, so callers never lock OS threads.
// Event.Wait (hipEventSynchronize), Stream.Synchronize and Stream.Close
// block the calling thread.
//
// # Copies
//
// Pinned buffers come from hipHostMalloc(PORTABLE|MAPPED); the device view
// of the same pages (hipHostGetDevicePointer) is the Pinned's DeviceAddr,
// for kernels and NICs. Copies take the host view. Streams are created
// NonBlocking, events with DisableTiming. Gather and Scatter merge
// segments that continue each other, then issue one hipMemcpyAsync per
// remaining range (D2H or H2D), all in one cgo call: HIP has no batched
// copy that stage binds, and there is no gather kernel yet, so chunks of
// many small blocks cost one copy each. If enqueuing fails part-way, the
// stream is synchronized before the error returns, so the slot is idle when
// the caller gets it back. Stream.CopyDtoD enqueues a device-to-device copy
// (for imported IPC mappings on one node).
//
// # IPC with the sub-allocation offset
//
// An IPC handle names an allocation and opens at its base. Export takes
// any device pointer, finds its allocation with hipMemGetAddressRange,
// exports the BASE with hipIpcGetMemHandle and returns the pointer's offset
// inside it (Export.Offset); the offset travels beside the handle as the
// region's offset. Import opens each handle once per Device
// (hipIpcOpenMemHandle, LazyEnablePeerAccess), keyed by its 64 bytes and
// reference counted: every Import returns a Mapping of the same open
// handle, and hipIpcCloseMemHandle runs when the last Mapping closes. The
// runtime's size of the opened allocation bounds every claim.
// ImportRegion adds the window [offset, offset+length), checked with
// overflow-safe arithmetic, and Region.Seg adds the offset back on every
// address it hands out. Dropping that offset (MoRI's XGMI bug) moves the
// wrong bytes: the fake maps the base as the runtime does, so the tests
// catch it.
//
// # Ownership
//
// AllocPinned memory is the caller's until FreePinned. Seg slices may be
// reused as soon as Gather or Scatter returns; the bytes they name must
// stay mapped until an event recorded after the copy completed. Mappings
// and Regions must be closed before the exporter frees the memory.
// Device.Close reports streams, events, pinned buffers, mappings, open
// handles and engine-side allocations still open.
//
// Engine-side helpers (AllocDevice, FreeDevice, Export, CopyHtoD,
// CopyDtoH) serve tests and Go engines; the sidecar itself never allocates
// device memory.
package hip
