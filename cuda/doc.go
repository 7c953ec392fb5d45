// Package cuda is stage's NVIDIA backend: it implements device.Device on the
// CUDA driver API (libcuda.so.1), loaded with dlopen when a device is first
// opened, so one stage binary builds without the CUDA SDK and runs on nodes
// with or without a GPU. Importing the package registers it under
// device.KindCUDA; nothing is loaded at init.
//
// # What it binds
//
// OpenLibrary resolves every entry point once into a C struct of function
// pointers (shim.h lists each with its C prototype), preferring the
// versioned exports (cuMemAlloc_v2, cuMemcpyDtoHAsync_v2,
// cuIpcOpenMemHandle_v2, ...). Missing required symbols fail the open with
// one error naming the library and all of them; the optional ones
// (cuMemcpyBatchAsync_v2 / cuMemcpyBatchAsync, the VMM calls) are recorded in
// Library.Absent with what their absence costs. The library is
// device.cuda.library (Config.Library), by default libcuda.so.1, loaded by
// internal/dl like every vendor library. A small C shim (shim.c) holds the
// trampolines: cgo cannot call function pointers, and the 64-byte
// CUipcMemHandle must be passed by value. Driver errors are *Error values
// carrying the call, its arguments and the driver's own name and text;
// errors.Is maps them onto device.ErrOutOfMemory, ErrNotSupported and
// ErrNotReady.
//
// # Threads and contexts
//
// Every Device drives its GPU's primary context (cuDevicePrimaryCtxRetain),
// the one PyTorch uses, so memory an engine shares is valid in it. A CUDA
// context is current per OS thread and goroutines move between threads, so
// every trampoline that needs a context makes the device's primary context
// current on the calling thread first (cuCtxGetCurrent, then cuCtxSetCurrent
// only when it differs) inside the same cgo call as the operation. Callers
// never lock OS threads and may call from any goroutine; one call costs one
// cgo crossing. Event.Wait, Stream.Synchronize and a full descriptor ring
// block the calling OS thread (cuEventSynchronize / cuStreamSynchronize).
//
// # Copies
//
// A Gather or Scatter of one segment is one cuMemcpyDtoHAsync /
// cuMemcpyHtoDAsync. Several segments take the device's copy mode, chosen at
// open (device.cuda.copy_mode, Config.CopyMode: kernel|batch|percopy, else the
// best available):
//
//   - kernel: one launch of stage_copy_segments (kernels/gather.cu; the PTX
//     is embedded and JIT-compiled by cuModuleLoadData) per up to 1024
//     descriptors {src, dst, len}. The kernel reads and writes the pinned
//     slot through its device address, so a gather lands in host memory with
//     no device bounce buffer. Descriptors live in a per-stream ring of
//     host-mapped pinned slots that the kernel reads in place; a slot is
//     reused only after the event recorded behind its launch completed.
//     Where the module has stage_copy_strided, a slot's segments are first
//     compressed (strided.go) into strided descriptors of up to 32 KiB: n2
//     rows of n1 equal pieces, pieces and rows at constant strides; a slot
//     whose segments average fewer than 4 pieces per descriptor keeps the
//     plain kernel.
//   - batch: one cuMemcpyBatchAsync (CUDA 12.8+; the CUDA 13 _v2 ABI is
//     preferred), descriptors in per-stream C memory.
//   - percopy: one cuMemcpy*Async per segment, issued in a single cgo call.
//
// # Ownership
//
// A Pinned from AllocPinned is the caller's until FreePinned; one from
// RegisterHost until UnregisterHost, and the registered memory must not be
// Go heap memory (use mmap). Seg slices may be reused as soon as Gather or
// Scatter returns; the bytes they name must stay mapped until an event
// recorded after the copy completed. Import never takes the caller's fd.
// Device.Close reports streams, events, pinned buffers, mappings and
// engine-side allocations still open.
//
// Engine-side helpers (AllocDevice, Export, VMMAlloc, CopyHtoD, CopyDtoH)
// serve tests and Go engines; the sidecar itself never allocates device
// memory.
//
// # Verified on
//
// NVIDIA H100 80GB HBM3 (compute 9.0, 132 SMs) and 2 x H200 (NV18), driver
// 580.159.04 (CUDA 13.0), Ubuntu glibc 2.39; PTX from nvcc 13.0.88
// (-arch=compute_80). On both
// the GPU tests (build tag gpu) pass in all three copy modes, including
// legacy IPC and POSIX-fd VMM imports across processes; cuMemCreate with
// FABRIC handles is refused with CUDA_ERROR_NOT_PERMITTED, so VMMAlloc takes
// the POSIX-fd fallback (on the H200s too). Measured on the H100
// (one stream, 256 scattered 16 KiB blocks per 4 MiB pinned slot, GB/s):
// gather kernel 50.0, batch 19.9-23.4, percopy 6.6-7.4; scatter kernel
// 47.8-48.1, batch 22.6-26.6, percopy 5.9-6.0; one 4 MiB D2H 53.6-53.9, H2D
// 52.5-52.7. The reference gather kernel writing to mapped host memory
// reached 51.4-51.8 in the same job. A bound call costs about 115 ns
// (cgo + cuDriverGetVersion); cuEventQuery about 1.6 us, which is why the
// descriptor ring queries one event per 16 launches when the GPU keeps up.
package cuda
