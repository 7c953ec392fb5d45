/* shim.h: the slice of the CUDA driver API (libcuda.so.1) that stage binds,
 * declared by hand so that no CUDA header is needed at build time, plus the
 * trampolines Go calls. Every trampoline that needs a context takes the
 * device's primary context and makes it current on the calling OS thread
 * first (see stage_ctx in shim.c), so a Go call is one cgo crossing whatever
 * thread the goroutine runs on. */
#ifndef STAGE_CUDA_SHIM_H
#define STAGE_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef unsigned long long CUmemGenericAllocationHandle;

/* CU_IPC_HANDLE_SIZE = 64; passed BY VALUE to cuIpcOpenMemHandle_v2. */
typedef struct { char reserved[64]; } CUipcMemHandle;

/* CUmemLocation: {CUmemLocationType type; int id;} DEVICE = 1, HOST = 2. */
typedef struct { int type; int id; } CUmemLocation;

/* CUmemAllocationProp, 32 bytes. */
typedef struct {
	int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
	int requestedHandleTypes; /* POSIX_FILE_DESCRIPTOR = 1, FABRIC = 8 */
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

/* CUmemAccessDesc, 12 bytes; flags PROT_READWRITE = 3. */
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;

/* CUmemcpyAttributes, 24 bytes; srcAccessOrder STREAM = 1. */
typedef struct {
	int srcAccessOrder;
	CUmemLocation srcLocHint;
	CUmemLocation dstLocHint;
	unsigned int flags;
} CUmemcpyAttributes;

/* The bound entry points, one field per symbol, resolved once at open. The
 * field is named after the export it is read from. */
typedef struct stage_cu {
	/* CUresult cuInit(unsigned int Flags); */
	CUresult (*cuInit)(unsigned int);
	/* CUresult cuDriverGetVersion(int *driverVersion); */
	CUresult (*cuDriverGetVersion)(int *);
	/* CUresult cuGetErrorName(CUresult error, const char **pStr); */
	CUresult (*cuGetErrorName)(CUresult, const char **);
	/* CUresult cuGetErrorString(CUresult error, const char **pStr); */
	CUresult (*cuGetErrorString)(CUresult, const char **);
	/* CUresult cuDeviceGet(CUdevice *device, int ordinal); */
	CUresult (*cuDeviceGet)(CUdevice *, int);
	/* CUresult cuDeviceGetCount(int *count); */
	CUresult (*cuDeviceGetCount)(int *);
	/* CUresult cuDeviceGetName(char *name, int len, CUdevice dev); */
	CUresult (*cuDeviceGetName)(char *, int, CUdevice);
	/* CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev); */
	CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
	/* CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev); */
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	/* CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev); */
	CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice);
	/* CUresult cuCtxSetCurrent(CUcontext ctx); */
	CUresult (*cuCtxSetCurrent)(CUcontext);
	/* CUresult cuCtxGetCurrent(CUcontext *pctx); */
	CUresult (*cuCtxGetCurrent)(CUcontext *);
	/* CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize); */
	CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
	/* CUresult cuMemFree_v2(CUdeviceptr dptr); */
	CUresult (*cuMemFree_v2)(CUdeviceptr);
	/* CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr); */
	CUresult (*cuMemGetAddressRange_v2)(CUdeviceptr *, size_t *, CUdeviceptr);
	/* CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags); */
	CUresult (*cuMemHostAlloc)(void **, size_t, unsigned int);
	/* CUresult cuMemFreeHost(void *p); */
	CUresult (*cuMemFreeHost)(void *);
	/* CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags); */
	CUresult (*cuMemHostGetDevicePointer_v2)(CUdeviceptr *, void *, unsigned int);
	/* CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags); */
	CUresult (*cuMemHostRegister_v2)(void *, size_t, unsigned int);
	/* CUresult cuMemHostUnregister(void *p); */
	CUresult (*cuMemHostUnregister)(void *);
	/* CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount); */
	CUresult (*cuMemcpyHtoD_v2)(CUdeviceptr, const void *, size_t);
	/* CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount); */
	CUresult (*cuMemcpyDtoH_v2)(void *, CUdeviceptr, size_t);
	/* CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream); */
	CUresult (*cuMemcpyHtoDAsync_v2)(CUdeviceptr, const void *, size_t, CUstream);
	/* CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream); */
	CUresult (*cuMemcpyDtoHAsync_v2)(void *, CUdeviceptr, size_t, CUstream);
	/* CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream); */
	CUresult (*cuMemcpyDtoDAsync_v2)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	/* CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags); */
	CUresult (*cuStreamCreate)(CUstream *, unsigned int);
	/* CUresult cuStreamDestroy_v2(CUstream hStream); */
	CUresult (*cuStreamDestroy_v2)(CUstream);
	/* CUresult cuStreamSynchronize(CUstream hStream); */
	CUresult (*cuStreamSynchronize)(CUstream);
	/* CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags); */
	CUresult (*cuEventCreate)(CUevent *, unsigned int);
	/* CUresult cuEventDestroy_v2(CUevent hEvent); */
	CUresult (*cuEventDestroy_v2)(CUevent);
	/* CUresult cuEventRecord(CUevent hEvent, CUstream hStream); */
	CUresult (*cuEventRecord)(CUevent, CUstream);
	/* CUresult cuEventQuery(CUevent hEvent); */
	CUresult (*cuEventQuery)(CUevent);
	/* CUresult cuEventSynchronize(CUevent hEvent); */
	CUresult (*cuEventSynchronize)(CUevent);
	/* CUresult cuModuleLoadData(CUmodule *module, const void *image); */
	CUresult (*cuModuleLoadData)(CUmodule *, const void *);
	/* CUresult cuModuleUnload(CUmodule hmod); */
	CUresult (*cuModuleUnload)(CUmodule);
	/* CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name); */
	CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
	/* CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
	 *     unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
	 *     unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
	 *     void **kernelParams, void **extra); */
	CUresult (*cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int,
	                           unsigned int, unsigned int, unsigned int, unsigned int,
	                           CUstream, void **, void **);
	/* CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr); */
	CUresult (*cuIpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	/* CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags); */
	CUresult (*cuIpcOpenMemHandle_v2)(CUdeviceptr *, CUipcMemHandle, unsigned int);
	/* CUresult cuIpcCloseMemHandle(CUdeviceptr dptr); */
	CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);

	/* ---- optional from here on (see stage_syms in shim.c) ---- */

	/* CUDA 13: CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs,
	 *     size_t *sizes, size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
	 *     size_t numAttrs, CUstream hStream); */
	CUresult (*cuMemcpyBatchAsync_v2)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
	                                  CUmemcpyAttributes *, size_t *, size_t, CUstream);
	/* CUDA 12.8: CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs,
	 *     size_t *sizes, size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
	 *     size_t numAttrs, size_t *failIdx, CUstream hStream); */
	CUresult (*cuMemcpyBatchAsync)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
	                               CUmemcpyAttributes *, size_t *, size_t, size_t *, CUstream);
	/* CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
	 *     const CUmemAllocationProp *prop, unsigned long long flags); */
	CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
	                        unsigned long long);
	/* CUresult cuMemRelease(CUmemGenericAllocationHandle handle); */
	CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
	/* CUresult cuMemExportToShareableHandle(void *shareableHandle,
	 *     CUmemGenericAllocationHandle handle, CUmemAllocationHandleType handleType,
	 *     unsigned long long flags); */
	CUresult (*cuMemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int,
	                                         unsigned long long);
	/* CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
	 *     void *osHandle, CUmemAllocationHandleType shHandleType); */
	CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, int);
	/* CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
	 *     CUdeviceptr addr, unsigned long long flags); */
	CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	/* CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size); */
	CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
	/* CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
	 *     CUmemGenericAllocationHandle handle, unsigned long long flags); */
	CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
	                     unsigned long long);
	/* CUresult cuMemUnmap(CUdeviceptr ptr, size_t size); */
	CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
	/* CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
	 *     size_t count); */
	CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	/* CUresult cuMemGetAllocationGranularity(size_t *granularity,
	 *     const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option); */
	CUresult (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
} stage_cu;

/* Symbol table (shim.c): export name, whether optional, group. */
int stage_nsyms(void);
const char *stage_sym_name(int i);
int stage_sym_optional(int i);
void stage_sym_set(stage_cu *l, int i, void *fp);
stage_cu *stage_cu_new(void);
void stage_cu_free(stage_cu *l);

/* Process-wide, no context. */
CUresult stage_init(const stage_cu *l);
CUresult stage_driver_version(const stage_cu *l, int *v);
const char *stage_error_name(const stage_cu *l, CUresult r);
const char *stage_error_string(const stage_cu *l, CUresult r);
CUresult stage_device_get(const stage_cu *l, int ordinal, CUdevice *dev);
CUresult stage_device_count(const stage_cu *l, int *n);
CUresult stage_device_name(const stage_cu *l, CUdevice dev, char *buf, int len);
CUresult stage_device_attr(const stage_cu *l, CUdevice dev, int attr, int *v);
CUresult stage_primary_retain(const stage_cu *l, CUdevice dev, CUcontext *ctx);
CUresult stage_primary_release(const stage_cu *l, CUdevice dev);

/* Memory. */
CUresult stage_mem_alloc(const stage_cu *l, CUcontext ctx, size_t n, CUdeviceptr *p);
CUresult stage_mem_free(const stage_cu *l, CUcontext ctx, CUdeviceptr p);
CUresult stage_mem_range(const stage_cu *l, CUcontext ctx, CUdeviceptr p, CUdeviceptr *base, size_t *size);
CUresult stage_host_alloc(const stage_cu *l, CUcontext ctx, size_t n, unsigned flags, void **host, CUdeviceptr *dev);
CUresult stage_host_free(const stage_cu *l, CUcontext ctx, void *host);
CUresult stage_host_register(const stage_cu *l, CUcontext ctx, uintptr_t host, size_t n, unsigned flags, CUdeviceptr *dev);
CUresult stage_host_unregister(const stage_cu *l, CUcontext ctx, uintptr_t host);
CUresult stage_copy_htod(const stage_cu *l, CUcontext ctx, CUdeviceptr dst, const void *src, size_t n);
CUresult stage_copy_dtoh(const stage_cu *l, CUcontext ctx, void *dst, CUdeviceptr src, size_t n);

/* Streams and events. */
CUresult stage_stream_create(const stage_cu *l, CUcontext ctx, unsigned flags, CUstream *s);
CUresult stage_stream_destroy(const stage_cu *l, CUcontext ctx, CUstream s);
CUresult stage_stream_sync(const stage_cu *l, CUcontext ctx, CUstream s);
CUresult stage_event_create(const stage_cu *l, CUcontext ctx, unsigned flags, CUevent *e);
CUresult stage_event_destroy(const stage_cu *l, CUcontext ctx, CUevent e);
CUresult stage_event_record(const stage_cu *l, CUcontext ctx, CUevent e, CUstream s);
CUresult stage_event_query(const stage_cu *l, CUcontext ctx, CUevent e);
CUresult stage_event_sync(const stage_cu *l, CUcontext ctx, CUevent e);
CUresult stage_event_wait(const stage_cu *l, CUcontext ctx, CUevent e, int64_t spin_ns);

/* Copies on a stream. Host addresses travel as integers. */
CUresult stage_dtoh_async(const stage_cu *l, CUcontext ctx, uintptr_t dst, CUdeviceptr src, size_t n, CUstream s);
CUresult stage_htod_async(const stage_cu *l, CUcontext ctx, CUdeviceptr dst, uintptr_t src, size_t n, CUstream s);
CUresult stage_dtod_async(const stage_cu *l, CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);

/* Per-stream C scratch for batch and per-copy modes (struct of arrays). */
typedef struct {
	CUdeviceptr *dsts;
	CUdeviceptr *srcs;
	size_t *sizes;
	size_t cap;
	size_t fail; /* index of the failing copy, set on error */
	CUmemcpyAttributes attr;
	size_t attr_idx;
} stage_scratch;
stage_scratch *stage_scratch_new(void);
int stage_scratch_reserve(stage_scratch *sc, size_t n);
void stage_scratch_free(stage_scratch *sc);

/* dir: 0 = device to host, 1 = host to device. */
CUresult stage_batch(const stage_cu *l, CUcontext ctx, stage_scratch *sc, size_t count, CUstream s);
/* dir: 0 device to host, 1 host to device, 2 device to device. */
CUresult stage_percopy(const stage_cu *l, CUcontext ctx, int dir, stage_scratch *sc, size_t count, CUstream s);

/* Modules and the copy kernel. */
CUresult stage_module_load(const stage_cu *l, CUcontext ctx, const char *image, const char *fname,
                           CUmodule *mod, CUfunction *fn);
CUresult stage_module_unload(const stage_cu *l, CUcontext ctx, CUmodule mod);
CUresult stage_module_function(const stage_cu *l, CUcontext ctx, CUmodule mod, const char *fname, CUfunction *fn);
/* Launches fn(descs, count) with grid x block threads, then records ev.
 * step is 0 when the launch failed, 1 when the record did. Returned by value
 * so the hot path passes no Go pointer. */
typedef struct { CUresult rc; int step; } stage_launch_result;
stage_launch_result stage_launch_copy(const stage_cu *l, CUcontext ctx, CUfunction fn, CUdeviceptr descs,
                                      unsigned count, unsigned grid, unsigned block, CUstream s, CUevent ev);

/* IPC. */
CUresult stage_ipc_get(const stage_cu *l, CUcontext ctx, CUdeviceptr p, char *out64);
CUresult stage_ipc_open(const stage_cu *l, CUcontext ctx, const char *h64, unsigned flags, CUdeviceptr *p);
CUresult stage_ipc_close(const stage_cu *l, CUcontext ctx, CUdeviceptr p);

/* VMM. Steps name the call that failed, in order: */
enum {
	STAGE_VMM_GRANULARITY = 0,
	STAGE_VMM_CREATE = 1,
	STAGE_VMM_IMPORT = 2,
	STAGE_VMM_RESERVE = 3,
	STAGE_VMM_MAP = 4,
	STAGE_VMM_ACCESS = 5,
	STAGE_VMM_UNMAP = 6,
	STAGE_VMM_ADDRFREE = 7,
	STAGE_VMM_RELEASE = 8,
	STAGE_VMM_EXPORT = 9,
};
/* Creates (fd < 0) or imports (fd >= 0) an allocation, reserves an address
 * range, maps it and grants this device read/write. On failure undoes what
 * it did and sets *step. *size is rounded up to the granularity on return. */
CUresult stage_vmm_setup(const stage_cu *l, CUcontext ctx, int ordinal, int handle_types, int fd,
                         size_t *size, CUmemGenericAllocationHandle *h, CUdeviceptr *p, int *step);
/* Unmaps, frees the address range and releases the handle; all three are
 * tried, the first failure is returned with *step. */
CUresult stage_vmm_teardown(const stage_cu *l, CUcontext ctx, CUdeviceptr p, size_t size,
                            CUmemGenericAllocationHandle h, int *step);
CUresult stage_vmm_export_fd(const stage_cu *l, CUcontext ctx, CUmemGenericAllocationHandle h, int *fd);

#endif
