/* shim.h: the slice of the Ascend runtime (libascendcl.so, CANN's acl/acl_rt.h)
 * that stage binds, declared by hand so that no CANN header is needed at build
 * time, and the trampolines Go calls.
 *
 * Threading: ACL binds a context (and so a device) to each OS thread. Every
 * trampoline that works on a device takes that device's context and makes it
 * current on the calling thread first (stacl_ctx in shim.c), inside the same
 * cgo call as the operation, so Go may call from any goroutine on any thread.
 *
 * Errors: aclGetRecentErrMsg() reports the last failure OF THE CALLING THREAD
 * and clears it, so it must be read on the thread that failed, before Go can
 * move to another one. Trampolines therefore return stacl_ret: the aclError
 * and, on failure, a malloc'd copy of that message (Go frees it). */
#ifndef STACL_SHIM_H
#define STACL_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef int aclError;           /* 0 is ACL_SUCCESS */
typedef void *aclrtStream;
typedef void *aclrtEvent;
typedef void *aclrtContext;

/* aclrtMemLocation: {uint32_t id; aclrtMemLocationType type;}, 8 bytes;
 * type HOST = 0, DEVICE = 1 (aclrtMemLocationType). */
typedef struct { uint32_t id; int32_t type; } aclrtMemLocation;

/* aclrtMemcpyBatchAttr: {dstLoc, srcLoc, uint8_t rsv[16]}, 32 bytes. */
typedef struct {
	aclrtMemLocation dstLoc;
	aclrtMemLocation srcLoc;
	uint8_t rsv[16];
} aclrtMemcpyBatchAttr;

/* aclrtDrvMemHandle: a physical allocation (aclrtMallocPhysical, or
 * imported with aclrtMemImportFromShareableHandle). */
typedef void *aclrtDrvMemHandle;

/* aclrtPhysicalMemProp: {aclrtMemHandleType handleType; aclrtMemAllocationType
 * allocationType; aclrtMemAttr memAttr; aclrtMemLocation location; uint64_t
 * reserve;}, 32 bytes. handleType NONE = 0, allocationType PINNED = 0,
 * memAttr ACL_HBM_MEM_HUGE = 4. */
typedef struct {
	int32_t handleType;
	int32_t allocationType;
	int32_t memAttr;
	aclrtMemLocation location;
	uint64_t reserve;
} aclrtPhysicalMemProp;

/* aclrtMemAccessDesc: {aclrtMemAccessFlags flags; aclrtMemLocation location;
 * uint8_t rsv[12];}, 24 bytes. flags NONE 0, READ 1, READWRITE 3 (CANN's
 * documentation: only READWRITE is supported so far). */
typedef struct {
	int32_t flags;
	aclrtMemLocation location;
	uint8_t rsv[12];
} aclrtMemAccessDesc;

/* The bound entry points, one field per export, resolved once at open. The
 * field is named after the export it is read from. */
typedef struct stacl_acl {
	/* aclError aclInit(const char *configPath); */
	aclError (*aclInit)(const char *);
	/* const char *aclGetRecentErrMsg(void); */
	const char *(*aclGetRecentErrMsg)(void);
	/* aclError aclrtGetDeviceCount(uint32_t *count); */
	aclError (*aclrtGetDeviceCount)(uint32_t *);
	/* aclError aclrtSetDevice(int32_t deviceId); reference counted */
	aclError (*aclrtSetDevice)(int32_t);
	/* aclError aclrtResetDevice(int32_t deviceId); */
	aclError (*aclrtResetDevice)(int32_t);
	/* aclError aclrtGetCurrentContext(aclrtContext *context); */
	aclError (*aclrtGetCurrentContext)(aclrtContext *);
	/* aclError aclrtSetCurrentContext(aclrtContext context); */
	aclError (*aclrtSetCurrentContext)(aclrtContext);
	/* aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy); */
	aclError (*aclrtMalloc)(void **, size_t, int);
	/* aclError aclrtFree(void *devPtr); */
	aclError (*aclrtFree)(void *);
	/* aclError aclrtMallocHost(void **hostPtr, size_t size); */
	aclError (*aclrtMallocHost)(void **, size_t);
	/* aclError aclrtFreeHost(void *hostPtr); */
	aclError (*aclrtFreeHost)(void *);
	/* aclError aclrtHostRegister(void *ptr, uint64_t size, aclrtHostRegisterType type, void **devPtr);
	 * type MAPPED = 0. The device address it returns is for kernels and
	 * NICs; it is not a memcpy address. */
	aclError (*aclrtHostRegister)(void *, uint64_t, int, void **);
	/* aclError aclrtHostUnregister(void *ptr); */
	aclError (*aclrtHostUnregister)(void *);
	/* aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
	 *     aclrtMemcpyKind kind); kind H2H 0, H2D 1, D2H 2, D2D 3 */
	aclError (*aclrtMemcpy)(void *, size_t, const void *, size_t, int);
	/* aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
	 *     aclrtMemcpyKind kind, aclrtStream stream); */
	aclError (*aclrtMemcpyAsync)(void *, size_t, const void *, size_t, int, aclrtStream);
	/* aclError aclrtCreateStream(aclrtStream *stream); */
	aclError (*aclrtCreateStream)(aclrtStream *);
	/* aclError aclrtDestroyStream(aclrtStream stream); */
	aclError (*aclrtDestroyStream)(aclrtStream);
	/* aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout);
	 * timeout in ms, -1 waits forever; 507046 when it ran out */
	aclError (*aclrtSynchronizeStreamWithTimeout)(aclrtStream, int32_t);
	/* aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag); */
	aclError (*aclrtCreateEventWithFlag)(aclrtEvent *, uint32_t);
	/* aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream); */
	aclError (*aclrtRecordEvent)(aclrtEvent, aclrtStream);
	/* aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status);
	 * NOT_READY = 0, COMPLETE = 1. NOT aclrtQueryEvent: that older call
	 * reports aclrtEventStatus, where COMPLETE = 0 and NOT_READY = 1. */
	aclError (*aclrtQueryEventStatus)(aclrtEvent, int32_t *);
	/* aclError aclrtDestroyEvent(aclrtEvent event); */
	aclError (*aclrtDestroyEvent)(aclrtEvent);

	/* ---- optional from here on (see stacl_syms in shim.c) ---- */

	/* aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag);
	 * flag FAST_LAUNCH 0x1, FAST_SYNC 0x2 */
	aclError (*aclrtCreateStreamWithConfig)(aclrtStream *, uint32_t, uint32_t);
	/* CANN 8.3+: aclError aclrtMemcpyBatchAsync(void **dsts, size_t *destMaxs, void **srcs,
	 *     size_t *sizes, size_t numBatches, aclrtMemcpyBatchAttr *attrs, size_t *attrsIndexes,
	 *     size_t numAttrs, size_t *failIndex, aclrtStream stream);
	 * one direction per call: all H2D or all D2H */
	aclError (*aclrtMemcpyBatchAsync)(void **, size_t *, void **, size_t *, size_t,
	                                  aclrtMemcpyBatchAttr *, size_t *, size_t, size_t *, aclrtStream);
	/* aclError aclrtIpcMemGetExportKey(void *devPtr, size_t size, char *key, size_t len, uint64_t flags);
	 * len 65; flags DEFAULT 0 (pid whitelist on), DISABLE_PID_VALIDATION 1 */
	aclError (*aclrtIpcMemGetExportKey)(void *, size_t, char *, size_t, uint64_t);
	/* aclError aclrtIpcMemSetImportPid(const char *key, int32_t *pid, size_t num); */
	aclError (*aclrtIpcMemSetImportPid)(const char *, int32_t *, size_t);
	/* aclError aclrtIpcMemImportByKey(void **devPtr, const char *key, uint64_t flags);
	 * flags DEFAULT 0, ENABLE_PEER_ACCESS 1 */
	aclError (*aclrtIpcMemImportByKey)(void **, const char *, uint64_t);
	/* aclError aclrtIpcMemClose(const char *key); importers close before the exporter */
	aclError (*aclrtIpcMemClose)(const char *);
	/* aclError aclrtDeviceGetBareTgid(int32_t *pid); the pid the whitelist wants */
	aclError (*aclrtDeviceGetBareTgid)(int32_t *);
	/* aclError aclrtMemGetAddressRange(void *ptr, void **pbase, size_t *psize);
	 * of a VMM address: the mapping (one physical chunk) that holds it */
	aclError (*aclrtMemGetAddressRange)(void *, void **, size_t *);
	/* aclError aclrtGetPhyDevIdByLogicDevId(const int32_t logicDevId, int32_t *const phyDevId);
	 * logical ids count the devices ASCEND_RT_VISIBLE_DEVICES shows this process */
	aclError (*aclrtGetPhyDevIdByLogicDevId)(int32_t, int32_t *);

	/* Import of VMM memory (STACL_SYM_VMM, all or nothing). */
	/* aclError aclrtMemImportFromShareableHandle(uint64_t shareableHandle, int32_t deviceId,
	 *     aclrtDrvMemHandle *handle); never in the exporting process; once per handle */
	aclError (*aclrtMemImportFromShareableHandle)(uint64_t, int32_t, aclrtDrvMemHandle *);
	/* aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr,
	 *     uint64_t flags); alignment 0 (reserved), expectPtr NULL, flags 0 */
	aclError (*aclrtReserveMemAddress)(void **, size_t, size_t, void *, uint64_t);
	/* aclError aclrtReleaseMemAddress(void *virPtr); */
	aclError (*aclrtReleaseMemAddress)(void *);
	/* aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle,
	 *     uint64_t flags); size = the physical allocation's, offset 0, flags 0 */
	aclError (*aclrtMapMem)(void *, size_t, size_t, aclrtDrvMemHandle, uint64_t);
	/* aclError aclrtUnmapMem(void *virPtr); */
	aclError (*aclrtUnmapMem)(void *);
	/* aclError aclrtMemSetAccess(void *virPtr, size_t size, aclrtMemAccessDesc *desc, size_t count);
	 * virPtr and size of one aclrtMapMem */
	aclError (*aclrtMemSetAccess)(void *, size_t, aclrtMemAccessDesc *, size_t);
	/* aclError aclrtFreePhysical(aclrtDrvMemHandle handle); */
	aclError (*aclrtFreePhysical)(aclrtDrvMemHandle);

	/* Export of VMM memory, for engines and tests (STACL_SYM_VMM_EXPORT). */
	/* aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size,
	 *     const aclrtPhysicalMemProp *prop, uint64_t flags); flags 0 */
	aclError (*aclrtMallocPhysical)(aclrtDrvMemHandle *, size_t, const aclrtPhysicalMemProp *, uint64_t);
	/* aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop,
	 *     aclrtMemGranularityOptions option, size_t *granularity); MINIMUM 0 */
	aclError (*aclrtMemGetAllocationGranularity)(aclrtPhysicalMemProp *, int32_t, size_t *);
	/* aclError aclrtMemRetainAllocationHandle(void *virPtr, aclrtDrvMemHandle *handle);
	 * virPtr: the start of a mapping; release with aclrtFreePhysical */
	aclError (*aclrtMemRetainAllocationHandle)(void *, aclrtDrvMemHandle *);
	/* aclError aclrtMemExportToShareableHandle(aclrtDrvMemHandle handle, aclrtMemHandleType handleType,
	 *     uint64_t flags, uint64_t *shareableHandle); handleType NONE 0; flags DEFAULT 0 (pid
	 *     whitelist on), DISABLE_PID_VALIDATION 1; once per handle */
	aclError (*aclrtMemExportToShareableHandle)(aclrtDrvMemHandle, int32_t, uint64_t, uint64_t *);
	/* aclError aclrtMemSetPidToShareableHandle(uint64_t shareableHandle, int32_t *pid, size_t pidNum);
	 * pids are the importers' aclrtDeviceGetBareTgid */
	aclError (*aclrtMemSetPidToShareableHandle)(uint64_t, int32_t *, size_t);
} stacl_acl;

/* Groups of optional symbols (stacl_sym_group). */
enum {
	STACL_SYM_REQUIRED = 0,
	STACL_SYM_BATCH = 1,  /* aclrtMemcpyBatchAsync */
	STACL_SYM_IPC = 2,    /* the four aclrtIpcMem* calls, all or nothing */
	STACL_SYM_EXTRA = 3,  /* each used alone when present */
	STACL_SYM_VMM = 4,    /* VMM import: all or nothing */
	STACL_SYM_VMM_EXPORT = 5, /* VMM allocation and export (engines, tests): all or nothing */
};

/* Symbol table (shim.c). */
int stacl_nsyms(void);
const char *stacl_sym_name(int i);
int stacl_sym_group(int i);
void stacl_sym_set(stacl_acl *l, int i, void *fp);
stacl_acl *stacl_acl_new(void);
void stacl_acl_free(stacl_acl *l);

/* What every trampoline returns: rc, and on failure the thread's
 * aclGetRecentErrMsg() text (malloc'd, may be NULL; the caller frees it). */
typedef struct { aclError rc; char *msg; } stacl_ret;

/* Process-wide, no context. */
stacl_ret stacl_init(const stacl_acl *l);
stacl_ret stacl_device_count(const stacl_acl *l, uint32_t *n);
/* aclrtSetDevice (once per Device), then the device's default context. */
stacl_ret stacl_set_device(const stacl_acl *l, int32_t dev, aclrtContext *ctx);
stacl_ret stacl_reset_device(const stacl_acl *l, int32_t dev);
stacl_ret stacl_bare_tgid(const stacl_acl *l, int32_t *pid);
stacl_ret stacl_phys_dev(const stacl_acl *l, int32_t logic, int32_t *phys);

/* Memory. Host addresses travel as integers. */
stacl_ret stacl_malloc(const stacl_acl *l, aclrtContext ctx, size_t n, int policy, uintptr_t *p);
stacl_ret stacl_free(const stacl_acl *l, aclrtContext ctx, uintptr_t p);
stacl_ret stacl_malloc_host(const stacl_acl *l, aclrtContext ctx, size_t n, void **p);
stacl_ret stacl_free_host(const stacl_acl *l, aclrtContext ctx, void *p);
stacl_ret stacl_host_register(const stacl_acl *l, aclrtContext ctx, void *p, size_t n, uintptr_t *dev);
stacl_ret stacl_host_unregister(const stacl_acl *l, aclrtContext ctx, void *p);
/* Synchronous copies (aclrtMemcpy) for engine-side helpers; src/dst may be
 * pageable (Go) memory. */
stacl_ret stacl_copy_h2d(const stacl_acl *l, aclrtContext ctx, uintptr_t dst, const void *src, size_t n);
stacl_ret stacl_copy_d2h(const stacl_acl *l, aclrtContext ctx, void *dst, uintptr_t src, size_t n);
stacl_ret stacl_mem_range(const stacl_acl *l, aclrtContext ctx, uintptr_t p, uintptr_t *base, size_t *size);

/* Streams and events. flags 0 means aclrtCreateStream. */
stacl_ret stacl_stream_create(const stacl_acl *l, aclrtContext ctx, uint32_t flags, aclrtStream *s);
stacl_ret stacl_stream_destroy(const stacl_acl *l, aclrtContext ctx, aclrtStream s);
stacl_ret stacl_stream_sync(const stacl_acl *l, aclrtContext ctx, aclrtStream s, int32_t timeout_ms);
stacl_ret stacl_event_create(const stacl_acl *l, aclrtContext ctx, uint32_t flags, aclrtEvent *e);
stacl_ret stacl_event_destroy(const stacl_acl *l, aclrtContext ctx, aclrtEvent e);
stacl_ret stacl_event_record(const stacl_acl *l, aclrtContext ctx, aclrtEvent e, aclrtStream s);
stacl_ret stacl_event_status(const stacl_acl *l, aclrtContext ctx, aclrtEvent e, int32_t *status);

/* Copies of one chunk. Go fills dev[i], len[i] (the device side, in order);
 * the contiguous side is host (the pinned slot) or, in pack mode, the
 * device ring. The batch arrays are filled here. Grown by Go with
 * stacl_scratch_reserve; one per stream. */
typedef struct {
	uint64_t *dev;
	uint64_t *len;
	void **dsts;
	void **srcs;
	size_t *sizes;
	size_t *dmax;
	size_t cap;
	aclrtMemcpyBatchAttr attr;
	size_t attr_idx;
	size_t fail;
} stacl_scratch;

stacl_scratch *stacl_scratch_new(void);
int stacl_scratch_reserve(stacl_scratch *sc, size_t n);
void stacl_scratch_free(stacl_scratch *sc);

enum { STACL_PERCOPY = 0, STACL_BATCH = 1, STACL_PACK = 2 };
/* Which call failed in stacl_move. */
enum {
	STACL_STEP_COPY = 0,  /* copy idx of the chunk (D2H/H2D, or pack's D2D) */
	STACL_STEP_BATCH = 1, /* aclrtMemcpyBatchAsync; idx = failIndex or SIZE_MAX */
	STACL_STEP_BULK = 2,  /* pack: the one D2H out of / H2D into the ring */
	STACL_STEP_CTX = 3,   /* making the context current */
};
typedef struct {
	aclError rc;
	char *msg;
	int step;
	size_t idx;
	int drained; /* some copies were already queued: the stream was synchronized */
} stacl_move_ret;

/* Enqueues the chunk described by sc[0..count) on s. gather: device -> host
 * (D2H); else host -> device. host is the pinned slot's HOST address;
 * ring is a device buffer of at least the chunk's size (pack only). */
stacl_move_ret stacl_move(const stacl_acl *l, aclrtContext ctx, stacl_scratch *sc, size_t count,
                          int mode, int gather, uintptr_t host, uintptr_t ring, uint32_t ordinal,
                          aclrtStream s);

/* IPC. key is a NUL-terminated string; export writes at most 65 bytes. */
stacl_ret stacl_ipc_export(const stacl_acl *l, aclrtContext ctx, uintptr_t p, size_t n, char *key65, uint64_t flags);
stacl_ret stacl_ipc_set_pids(const stacl_acl *l, aclrtContext ctx, const char *key, int32_t *pids, size_t n);
stacl_ret stacl_ipc_import(const stacl_acl *l, aclrtContext ctx, const char *key, uint64_t flags, uintptr_t *p);
stacl_ret stacl_ipc_close(const stacl_acl *l, aclrtContext ctx, const char *key);

/* VMM. Handles travel as integers. */
stacl_ret stacl_vmm_import(const stacl_acl *l, aclrtContext ctx, uint64_t shareable, int32_t dev, uintptr_t *h);
stacl_ret stacl_vmm_reserve(const stacl_acl *l, aclrtContext ctx, size_t n, uintptr_t *va);
stacl_ret stacl_vmm_release(const stacl_acl *l, aclrtContext ctx, uintptr_t va);
stacl_ret stacl_vmm_map(const stacl_acl *l, aclrtContext ctx, uintptr_t va, size_t n, uintptr_t h);
stacl_ret stacl_vmm_unmap(const stacl_acl *l, aclrtContext ctx, uintptr_t va);
stacl_ret stacl_vmm_access(const stacl_acl *l, aclrtContext ctx, uintptr_t va, size_t n, int32_t flags, uint32_t dev);
stacl_ret stacl_vmm_free(const stacl_acl *l, aclrtContext ctx, uintptr_t h);
stacl_ret stacl_vmm_granularity(const stacl_acl *l, aclrtContext ctx, uint32_t dev, size_t *g);
stacl_ret stacl_vmm_malloc(const stacl_acl *l, aclrtContext ctx, uint32_t dev, size_t n, uintptr_t *h);
stacl_ret stacl_vmm_retain(const stacl_acl *l, aclrtContext ctx, uintptr_t va, uintptr_t *h);
stacl_ret stacl_vmm_export(const stacl_acl *l, aclrtContext ctx, uintptr_t h, uint64_t flags, uint64_t *shareable);
stacl_ret stacl_vmm_set_pid(const stacl_acl *l, aclrtContext ctx, uint64_t shareable, int32_t pid);

#endif
