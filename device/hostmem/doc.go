// Package hostmem is the emulated device: a device.Device whose "device
// memory" is host memory of this process. CI, the demo and CPU-only nodes use
// it; the rest of stage cannot tell it from a real accelerator, because it
// keeps the same contract: asynchronous FIFO streams, events that complete
// when the work before them has, sticky stream errors, pinned buffers with a
// host view and a device view, and allocations shared by engine processes
// that the sidecar imports.
//
// # What it emulates
//
//   - Device memory: an engine process allocates it with NewShared (a memfd
//     mapped MAP_SHARED) and passes the fd over the control socket
//     (device.HandleMemfd). Import maps the same pages into the sidecar, so a
//     device.Addr is simply an address in this process. Import takes only
//     memfds sealed with F_SEAL_SHRINK (NewShared seals its own), since
//     its owner could otherwise truncate them under a copy. HandleHostAddr
//     wraps memory the sidecar process already has (tests and benchmarks).
//   - Pinned memory: AllocPinned maps a memfd of its own. The device view is
//     the host address itself, as with CUDA's unified virtual addressing.
//     Its pages are prefaulted (MAP_POPULATE) but not page-locked: mlock would
//     hit RLIMIT_MEMLOCK in containers and buys nothing here, since no DMA
//     engine reads these pages.
//   - Copy engines: each stream has one worker goroutine that runs its
//     gathers, scatters and event records in enqueue order. The queue is
//     bounded (streamQueue ops); an enqueue blocks while it is full. That is
//     backpressure, as on a real device whose command queue is full.
//   - Link speed: with Config.BandwidthBytesPerSec > 0 each copy takes at
//     least its length over that bandwidth, on a link shared by all
//     streams of the device with one direction each for gathers (D2H) and
//     scatters (H2D); Config.Latency adds a fixed delay per copy. The
//     memmove runs first and the worker then waits out the rest, so the
//     model only ever slows copies down.
//   - Failures: (*Dev).FailAfter(N), or Config.Fail with FailAfter N at
//     open (staged: STAGE_TEST_HOSTMEM_FAIL_AFTER=N, read once by config),
//     makes the copy after the next N fail with an error wrapping
//     ErrInjected. The failing copy moves no bytes, and its stream's error is
//     sticky from then on, like a CUDA stream after a faulting kernel: later
//     copies on it are skipped, every event recorded after it completes with
//     that error, and Synchronize returns it until the stream is closed.
//   - Memory faults: a copy that touches memory gone from under it (a file
//     truncated, a range unmapped) fails with an error wrapping ErrFault,
//     sticky like any failed copy, instead of the runtime's SIGBUS killing
//     the process (runtime/debug.SetPanicOnFault around every memmove).
//
// # What it never does
//
// It never talks to a vendor runtime, never page-locks memory, never
// dereferences an address it did not map or was not handed by the caller
// with HandleHostAddr, never bounds-checks a segment against a region (the
// sidecar's region table does that before it enqueues anything), and never
// blocks an enqueue for any other reason than a full queue.
//
// # Buffer ownership
//
//   - A Pinned buffer belongs to the caller from AllocPinned until FreePinned
//     of the whole buffer. It must not be freed while a copy on it is queued.
//   - A Mapping belongs to the caller until Close; the caller must have no
//     copy queued on it then. The fd of a memfd handle stays the caller's:
//     Import keeps only the mapping, which outlives the fd.
//   - Gather and Scatter copy the segment list before they return, so the
//     caller may reuse its []Seg at once. The bytes the segments and the
//     pinned buffer name must stay mapped, and must not be touched by the
//     caller, until an event recorded after the copy has completed.
//   - Memory wrapped with HandleHostAddr must stay alive and mapped (for Go
//     memory: reachable, e.g. with runtime.KeepAlive) until the mapping is
//     closed.
//   - Shared belongs to the engine-side process that made it; Close unmaps
//     it and closes its fd. Mappings imported from its fd stay valid.
//
// Device.Close closes whatever is still open (streams are drained first)
// and reports it with an error wrapping ErrLeaked, so leak tests can rely on
// it. The package is Linux-only (memfd_create).
package hostmem
