// Package acl is stage's Ascend backend: it implements device.Device on the
// Ascend runtime (libascendcl.so, CANN's acl/acl_rt.h), loaded with dlopen
// when a device is first opened, so one stage binary builds without CANN and
// runs on nodes with or without an NPU. Importing the package registers it
// under device.KindACL; nothing is loaded at init.
//
// # Status: emulation only
//
// This backend has run against emulations only: testdata/fakeacl.c (the
// ACL calls over host memory, in CI) and testdata/fakeacl_cuda.c (the same
// calls over the CUDA runtime, on one NVIDIA H100; its VMM calls, over
// CUDA's VMM driver API, have not run on a GPU yet). It has never run on an
// Ascend NPU. Before trusting it on one, check against the installed CANN
// headers and hardware:
//
//   - enum values and struct layouts: aclrtMemcpyKind (H2D 1, D2H 2, D2D 3),
//     aclrtMemMallocPolicy (HUGE_FIRST 0), ACL_HOST_REGISTER_MAPPED 0,
//     ACL_STREAM_FAST_LAUNCH 0x1 / FAST_SYNC 0x2, ACL_EVENT_SYNC 0x1,
//     aclrtMemLocation (8 bytes: id, type; HOST 0, DEVICE 1),
//     aclrtMemcpyBatchAttr (32 bytes: dstLoc, srcLoc, rsv[16]);
//   - aclrtMemcpyBatchAsync: exported by the installed CANN (8.5+), accepted
//     by the device (else the 207000 fallback to pack mode runs), the attr
//     layout, one attribute for the whole batch, and that D2H batches from
//     aclrtMallocHost memory are asynchronous;
//   - IPC: the export key length (65-byte buffer), that exporting the
//     allocation base and adding the offset moves the right bytes, the pid
//     whitelist semantics (aclrtIpcMemSetImportPid with the importer's
//     aclrtDeviceGetBareTgid, inside containers too), importer-before-
//     exporter close order, and import flags (we pass DEFAULT, 0: same
//     device, no peer access);
//   - whether the device address from aclrtHostRegister is usable by the
//     NPU at all (stage only stores it; copies use host pointers), and what
//     Ascend 950 (no aclrtHostRegister) returns;
//   - FAST_LAUNCH|FAST_SYNC streams: accepted with priority 0, and their
//     CPU cost next to polled events;
//   - event status values (aclrtQueryEventStatus: NOT_READY 0,
//     COMPLETE 1), that an event behind a failed copy stays NOT_READY and
//     the failure shows in aclrtSynchronizeStreamWithTimeout, and whether
//     ACL_EVENT_SYNC is the right event flag;
//   - error codes: 100002 on a second aclInit, 207001/207018 on device OOM,
//     207000 for unsupported features, 507046 on a sync timeout;
//   - which path torch_npu's memory needs: does aclrtIpcMemGetExportKey
//     accept the base of a non-expandable segment (aclrtMalloc) and refuse
//     memory of an expandable segment (VMM), and does
//     aclrtMemRetainAllocationHandle refuse aclrtMalloc memory (stage_client
//     takes the VMM path exactly when it accepts the start of the mapping
//     that holds the tensor);
//   - what aclrtMemGetAddressRange returns for a tensor in an expandable
//     segment: the documentation says the mapped block, which stage reads
//     as the one physical chunk (2 MiB or 20 MiB page) that holds the
//     address, its start and its size; if it answers the whole segment
//     instead, the chunk walk lists one chunk of the wrong size and the
//     sidecar's aclrtMapMem refuses it;
//   - the VMM calls' arguments: aclrtMemExportToShareableHandle with
//     handleType ACL_MEM_HANDLE_TYPE_NONE (0) and flags DEFAULT (0, whitelist
//     on) on a handle from aclrtMemRetainAllocationHandle, and whether a
//     handle torch_npu exported already (one shareable handle per handle)
//     makes it fail; releasing that retain with aclrtFreePhysical right after
//     the export, the memory staying; that a retain returns the same handle
//     for the same mapping each time (stage_client exports a chunk again
//     when its handle changed: torch_npu mapped another page there); aclrtMemImportFromShareableHandle with
//     the sidecar's device id; aclrtReserveMemAddress(alignment 0, expectPtr
//     NULL, flags 0); aclrtMapMem(offset 0, flags 0) of each chunk at its
//     physical size, several imported chunks in one reservation; that one
//     imported chunk may be mapped twice (two regions over it) from its one
//     import; aclrtMemSetAccess READWRITE (0x3) with location {device id,
//     DEVICE}: the documentation allows only READWRITE, so read-only
//     registrations are opened READWRITE too; the release order (unmap,
//     aclrtFreePhysical of the imports, aclrtReleaseMemAddress);
//   - a BareTgid whitelist from a sidecar in a container: the sidecar's
//     aclrtDeviceGetBareTgid (reported by QueryDevice) accepted by
//     aclrtMemSetPidToShareableHandle and aclrtIpcMemSetImportPid in the
//     engine's container, where the sidecar's getpid() and the socket's
//     SO_PEERCRED pid differ from it;
//   - same-device import plus copies: memory imported on the sidecar's own
//     device (ordinals as ASCEND_RT_VISIBLE_DEVICES numbers them in each
//     process; aclrtGetPhyDevIdByLogicDevId gives the physical id both sides
//     compare) copies D2H and H2D, and memory of another NPU fails the
//     import's one-byte D2H probe with the error the refusal reports;
//
// # What it binds
//
// OpenLibrary resolves every entry point once into a C struct of function
// pointers (shim.h lists each with its C prototype). Missing required
// symbols fail the open with one error naming the library and all of them;
// optional ones are recorded in Library.Absent with what their absence
// costs: aclrtMemcpyBatchAsync (probed with dlsym; without it multi-block
// chunks are packed), aclrtCreateStreamWithConfig (else aclrtCreateStream),
// the four aclrtIpcMem* calls (import by key), the VMM import calls
// (aclrtMemImportFromShareableHandle, aclrtReserveMemAddress,
// aclrtReleaseMemAddress, aclrtMapMem, aclrtUnmapMem, aclrtMemSetAccess,
// aclrtFreePhysical: all or none), the VMM export calls the Go engine
// helpers use, aclrtDeviceGetBareTgid, aclrtGetPhyDevIdByLogicDevId and
// aclrtMemGetAddressRange. The library is device.acl.library
// (Config.Library), by default libascendcl.so. aclInit is called once per Library; its
// ACL_ERROR_REPEAT_INITIALIZE (100002: torch_npu got there first) counts as
// success, and aclFinalize is never called.
//
// Completion is read with aclrtQueryEventStatus (NOT_READY 0, COMPLETE 1).
// The older aclrtQueryEvent reports the inverse (COMPLETE 0, NOT_READY 1)
// and is deliberately not bound.
//
// Errors are *Error values: the call with its arguments, the aclError, and
// the runtime's own text from aclGetRecentErrMsg. That text is per thread
// and cleared when read, so the trampolines read it in the same C call as
// the failure. errors.Is maps 207001 (and 207018, 200000) onto
// device.ErrOutOfMemory, 207000 (and 200001, 200006) onto
// device.ErrNotSupported, sync timeouts onto device.ErrNotReady.
//
// # Threads and contexts
//
// ACL binds a context, and so a device, to each OS thread, and goroutines
// move between threads. OpenDevice calls aclrtSetDevice once (it is
// reference counted; Close pairs it with aclrtResetDevice) and keeps the
// device's default context, the one every thread of the process that sets
// the device shares (torch_npu's too). Every trampoline then makes that
// context current on the calling thread (aclrtGetCurrentContext, and
// aclrtSetCurrentContext only when it differs) inside the same cgo call as
// the operation, so callers never lock OS threads. aclrtSetDevice per call
// would pile up references.
//
// Event.Wait polls aclrtQueryEventStatus: at once, then with sleeps from
// 10 us to 500 us. ACL reports an event behind a failed copy as NOT_READY
// forever, so a Wait that lasted 20 ms also asks the stream every 20 ms
// (aclrtSynchronizeStreamWithTimeout, 2 ms): a failed stream ends the Wait
// with its error, which stays with the stream (Query of later events
// returns it too). Stream.Synchronize and Close block the calling thread.
//
// # Copies
//
// Every copy takes the pinned slot's host address: the ACL docs say the
// device address that aclrtHostRegister returns is not for memory copies.
// Adjacent segments are merged first; a chunk that is then one range is one
// aclrtMemcpyAsync (D2H or H2D). Several ranges take the device's copy
// mode, chosen at open (device.acl.copy_mode, Config.CopyMode:
// batch|pack|percopy, else batch when the library exports
// aclrtMemcpyBatchAsync, pack when not), logged with the reason:
//
//   - batch: one aclrtMemcpyBatchAsync per chunk, one attribute {host,
//     device} for all copies. If the runtime refuses it (207000) the
//     device falls back to pack for good and logs it.
//   - pack: one D2D aclrtMemcpyAsync per block into a per-stream device
//     ring, then one D2H of the packed chunk into the slot (scatter: one
//     H2D into the ring, then a D2D per block), so the host link sees
//     slot-sized copies. The ring (2 x the largest chunk, aclrtMalloc) is
//     made on first use and freed with the stream; stream order makes its
//     reuse safe.
//   - percopy: one D2H (H2D) aclrtMemcpyAsync per block, straight into the
//     slot.
//
// The list is issued in one cgo call. If enqueuing fails part-way, the
// copies already queued are waited for before the error returns, so the
// slot is free when the caller gets it back.
//
// # Ownership
//
// AllocPinned memory (aclrtMallocHost, registered MAPPED for its device
// view) is the caller's until FreePinned, which unregisters, then frees.
// Seg slices may be reused as soon as Gather or Scatter returns; the bytes
// they name must stay mapped until an event recorded after the copy
// completed. Import maps an export key (device.HandleACLKey) with
// aclrtIpcMemImportByKey; the mapping's Close is aclrtIpcMemClose, which
// must come before the exporter closes its key and frees the memory. It
// maps VMM memory (device.HandleACLVMM, torch_npu's expandable segments)
// from its chunk list (vmm.go): each chunk imported on this device once,
// shared by every region over it, one range reserved per region, the
// chunks mapped in order and opened READWRITE; Close unmaps, lets go of
// the chunks and releases the range, and an import that fails partway
// undoes what it did in the same order. Both imports end with a one-byte
// D2H probe, so memory of another NPU is refused at registration with what
// to do (one acl sidecar per NPU, device.ordinal as the sidecar numbers
// devices), not at the first transfer. Shared
// host memory (device.HandleMemfd) is not supported: it would need async
// host-to-host copies, which ACL refuses in EP mode. Device.Close reports
// streams, events, pinned buffers, mappings and engine-side allocations
// still open.
//
// Engine-side helpers (AllocDevice, FreeDevice, Export, AllocVMM,
// FreeVMM, ExportVMM, CopyHtoD, CopyDtoH) serve tests and Go engines; the sidecar itself never allocates
// device memory outside a pack ring. Export exports the allocation base
// and whitelists the importers it is given (the sidecar's BareTgid);
// FreeDevice closes the key before freeing.
package acl
