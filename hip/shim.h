/* shim.h: the slice of AMD's HIP runtime (libamdhip64.so,
 * hip/hip_runtime_api.h) that stage binds, declared by hand so that no ROCm
 * header is needed at build time, and the trampolines Go calls.
 *
 * Threading: HIP keeps a current device per OS thread (hipSetDevice). Every
 * trampoline that works on a device takes its ordinal and makes it current
 * on the calling thread first (sthip_use in shim.c), inside the same cgo call
 * as the operation, so Go may call from any goroutine on any thread.
 *
 * Errors: hipGetErrorName and hipGetErrorString map a code to static text;
 * trampolines read both on failure and return them with the code
 * (sthip_ret). Nothing returned needs freeing. */
#ifndef STHIP_SHIM_H
#define STHIP_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef int hipError_t; /* 0 is hipSuccess */
typedef void *hipStream_t;
typedef void *hipEvent_t;

/* HIP_IPC_HANDLE_SIZE = 64. hipIpcOpenMemHandle takes it BY VALUE: under the
 * SysV x86-64 ABI a 64-byte struct travels in memory on the stack, which only
 * a C caller gets right without help, hence this shim. */
typedef struct { char reserved[64]; } hipIpcMemHandle_t;

/* The bound entry points, one field per export, resolved once at open. The
 * field is named after the export it is read from. */
typedef struct sthip_hip {
	/* hipError_t hipInit(unsigned int flags); flags must be 0 */
	hipError_t (*hipInit)(unsigned int);
	/* const char *hipGetErrorName(hipError_t error); "hipErrorInvalidValue" */
	const char *(*hipGetErrorName)(hipError_t);
	/* const char *hipGetErrorString(hipError_t error); a sentence */
	const char *(*hipGetErrorString)(hipError_t);
	/* hipError_t hipGetDeviceCount(int *count); */
	hipError_t (*hipGetDeviceCount)(int *);
	/* hipError_t hipSetDevice(int deviceId); current device of this thread */
	hipError_t (*hipSetDevice)(int);
	/* hipError_t hipGetDevice(int *deviceId); */
	hipError_t (*hipGetDevice)(int *);
	/* hipError_t hipMalloc(void **ptr, size_t size); */
	hipError_t (*hipMalloc)(void **, size_t);
	/* hipError_t hipFree(void *ptr); */
	hipError_t (*hipFree)(void *);
	/* hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags);
	 * flags hipHostMallocPortable 0x1, hipHostMallocMapped 0x2 */
	hipError_t (*hipHostMalloc)(void **, size_t, unsigned int);
	/* hipError_t hipHostFree(void *ptr); */
	hipError_t (*hipHostFree)(void *);
	/* hipError_t hipHostGetDevicePointer(void **devPtr, void *hstPtr, unsigned int flags);
	 * flags must be 0; the device view of MAPPED pinned memory */
	hipError_t (*hipHostGetDevicePointer)(void **, void *, unsigned int);
	/* hipError_t hipMemGetAddressRange(hipDeviceptr_t *pbase, size_t *psize, hipDeviceptr_t dptr);
	 * the base and size of the allocation holding dptr (an interior pointer too) */
	hipError_t (*hipMemGetAddressRange)(void **, size_t *, void *);
	/* hipError_t hipMemcpy(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind);
	 * kind hipMemcpyHostToDevice 1, hipMemcpyDeviceToHost 2, hipMemcpyDeviceToDevice 3 */
	hipError_t (*hipMemcpy)(void *, const void *, size_t, int);
	/* hipError_t hipMemcpyAsync(void *dst, const void *src, size_t sizeBytes,
	 *     hipMemcpyKind kind, hipStream_t stream); */
	hipError_t (*hipMemcpyAsync)(void *, const void *, size_t, int, hipStream_t);
	/* hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags);
	 * flags hipStreamNonBlocking 0x1 */
	hipError_t (*hipStreamCreateWithFlags)(hipStream_t *, unsigned int);
	/* hipError_t hipStreamDestroy(hipStream_t stream); */
	hipError_t (*hipStreamDestroy)(hipStream_t);
	/* hipError_t hipStreamSynchronize(hipStream_t stream); */
	hipError_t (*hipStreamSynchronize)(hipStream_t);
	/* hipError_t hipEventCreateWithFlags(hipEvent_t *event, unsigned flags);
	 * flags hipEventDisableTiming 0x2 */
	hipError_t (*hipEventCreateWithFlags)(hipEvent_t *, unsigned int);
	/* hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream); */
	hipError_t (*hipEventRecord)(hipEvent_t, hipStream_t);
	/* hipError_t hipEventQuery(hipEvent_t event); hipErrorNotReady (600) while pending */
	hipError_t (*hipEventQuery)(hipEvent_t);
	/* hipError_t hipEventSynchronize(hipEvent_t event); */
	hipError_t (*hipEventSynchronize)(hipEvent_t);
	/* hipError_t hipEventDestroy(hipEvent_t event); */
	hipError_t (*hipEventDestroy)(hipEvent_t);
	/* hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *handle, void *devPtr); */
	hipError_t (*hipIpcGetMemHandle)(hipIpcMemHandle_t *, void *);
	/* hipError_t hipIpcOpenMemHandle(void **devPtr, hipIpcMemHandle_t handle, unsigned int flags);
	 * handle BY VALUE; flags hipIpcMemLazyEnablePeerAccess 0x1; opens to the
	 * allocation BASE */
	hipError_t (*hipIpcOpenMemHandle)(void **, hipIpcMemHandle_t, unsigned int);
	/* hipError_t hipIpcCloseMemHandle(void *devPtr); the pointer open returned */
	hipError_t (*hipIpcCloseMemHandle)(void *);

	/* ---- optional from here on (see sthip_syms in shim.c) ---- */

	/* hipError_t hipDeviceEnablePeerAccess(int peerDeviceId, unsigned int flags);
	 * flags must be 0; hipErrorPeerAccessAlreadyEnabled (704) is success */
	hipError_t (*hipDeviceEnablePeerAccess)(int, unsigned int);
} sthip_hip;

/* Groups of symbols (sthip_sym_group). */
enum {
	STHIP_SYM_REQUIRED = 0,
	STHIP_SYM_OPTIONAL = 1,
};

/* Symbol table (shim.c). */
int sthip_nsyms(void);
const char *sthip_sym_name(int i);
int sthip_sym_group(int i);
void sthip_sym_set(sthip_hip *l, int i, void *fp);
sthip_hip *sthip_hip_new(void);
void sthip_hip_free(sthip_hip *l);

/* What every trampoline returns: the code and, on failure, the runtime's
 * static name and description of it (either may be NULL). */
typedef struct {
	hipError_t rc;
	const char *name;
	const char *msg;
} sthip_ret;

/* Process-wide: no current device needed. */
sthip_ret sthip_init(const sthip_hip *l);
sthip_ret sthip_device_count(const sthip_hip *l, int *n);
/* Text for a code (for errors found after the call that made them). */
sthip_ret sthip_describe(const sthip_hip *l, hipError_t rc);

/* Memory. Addresses travel as integers. */
sthip_ret sthip_malloc(const sthip_hip *l, int dev, size_t n, uintptr_t *p);
sthip_ret sthip_free(const sthip_hip *l, int dev, uintptr_t p);
/* hipHostMalloc(flags), then hipHostGetDevicePointer; frees on failure of
 * the second. *step says which call failed (0 alloc, 1 device pointer). */
sthip_ret sthip_host_alloc(const sthip_hip *l, int dev, size_t n, unsigned int flags, void **host,
                           uintptr_t *devp, int *step);
sthip_ret sthip_host_free(const sthip_hip *l, int dev, void *host);
sthip_ret sthip_mem_range(const sthip_hip *l, int dev, uintptr_t p, uintptr_t *base, size_t *size);
/* Synchronous copies (hipMemcpy) for engine-side helpers; the host side may
 * be pageable (Go) memory. */
sthip_ret sthip_copy_h2d(const sthip_hip *l, int dev, uintptr_t dst, const void *src, size_t n);
sthip_ret sthip_copy_d2h(const sthip_hip *l, int dev, void *dst, uintptr_t src, size_t n);
sthip_ret sthip_enable_peer(const sthip_hip *l, int dev, int peer);

/* Streams and events. */
sthip_ret sthip_stream_create(const sthip_hip *l, int dev, unsigned int flags, hipStream_t *s);
sthip_ret sthip_stream_destroy(const sthip_hip *l, int dev, hipStream_t s);
sthip_ret sthip_stream_sync(const sthip_hip *l, int dev, hipStream_t s);
sthip_ret sthip_event_create(const sthip_hip *l, int dev, unsigned int flags, hipEvent_t *e);
sthip_ret sthip_event_destroy(const sthip_hip *l, int dev, hipEvent_t e);
sthip_ret sthip_event_record(const sthip_hip *l, int dev, hipEvent_t e, hipStream_t s);
sthip_ret sthip_event_query(const sthip_hip *l, int dev, hipEvent_t e);
sthip_ret sthip_event_sync(const sthip_hip *l, int dev, hipEvent_t e);

/* One range of device memory; the layout of Go's device.Seg. */
typedef struct {
	uint64_t addr;
	uint64_t len;
} sthip_seg;

/* Enqueues one hipMemcpyAsync per segment between segs[0..n) and the
 * contiguous host buffer at host (the pinned slot's HOST address), in
 * order: kind 2 (D2H, gather) or 1 (H2D, scatter). On failure *idx is the
 * segment whose copy failed; if copies were already queued the stream is
 * synchronized before returning (*drained = 1), so the slot is idle. */
sthip_ret sthip_move(const sthip_hip *l, int dev, hipStream_t s, int kind, uintptr_t host,
                     const sthip_seg *segs, size_t n, size_t *idx, int *drained);
/* One device-to-device hipMemcpyAsync (kind 3). */
sthip_ret sthip_copy_d2d_async(const sthip_hip *l, int dev, hipStream_t s, uintptr_t dst, uintptr_t src, size_t n);

/* IPC. The handle crosses as 64 bytes; sthip_ipc_open passes it by value. */
sthip_ret sthip_ipc_get(const sthip_hip *l, int dev, uintptr_t p, char *handle64);
sthip_ret sthip_ipc_open(const sthip_hip *l, int dev, const char *handle64, unsigned int flags, uintptr_t *p);
sthip_ret sthip_ipc_close(const sthip_hip *l, int dev, uintptr_t p);

#endif
