/* shim.c: symbol table and trampolines of the cuda backend (see shim.h). */
#include "shim.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SYM(name, optional) { #name, optional, offsetof(stage_cu, name) }

static const struct {
	const char *name;
	int optional;
	size_t off;
} stage_syms[] = {
	SYM(cuInit, 0),
	SYM(cuDriverGetVersion, 0),
	SYM(cuGetErrorName, 0),
	SYM(cuGetErrorString, 0),
	SYM(cuDeviceGet, 0),
	SYM(cuDeviceGetCount, 0),
	SYM(cuDeviceGetName, 0),
	SYM(cuDeviceGetAttribute, 0),
	SYM(cuDevicePrimaryCtxRetain, 0),
	SYM(cuDevicePrimaryCtxRelease_v2, 0),
	SYM(cuCtxSetCurrent, 0),
	SYM(cuCtxGetCurrent, 0),
	SYM(cuMemAlloc_v2, 0),
	SYM(cuMemFree_v2, 0),
	SYM(cuMemGetAddressRange_v2, 0),
	SYM(cuMemHostAlloc, 0),
	SYM(cuMemFreeHost, 0),
	SYM(cuMemHostGetDevicePointer_v2, 0),
	SYM(cuMemHostRegister_v2, 0),
	SYM(cuMemHostUnregister, 0),
	SYM(cuMemcpyHtoD_v2, 0),
	SYM(cuMemcpyDtoH_v2, 0),
	SYM(cuMemcpyHtoDAsync_v2, 0),
	SYM(cuMemcpyDtoHAsync_v2, 0),
	SYM(cuMemcpyDtoDAsync_v2, 0),
	SYM(cuStreamCreate, 0),
	SYM(cuStreamDestroy_v2, 0),
	SYM(cuStreamSynchronize, 0),
	SYM(cuEventCreate, 0),
	SYM(cuEventDestroy_v2, 0),
	SYM(cuEventRecord, 0),
	SYM(cuEventQuery, 0),
	SYM(cuEventSynchronize, 0),
	SYM(cuModuleLoadData, 0),
	SYM(cuModuleUnload, 0),
	SYM(cuModuleGetFunction, 0),
	SYM(cuLaunchKernel, 0),
	SYM(cuIpcGetMemHandle, 0),
	SYM(cuIpcOpenMemHandle_v2, 0),
	SYM(cuIpcCloseMemHandle, 0),
	SYM(cuMemcpyBatchAsync_v2, 1),
	SYM(cuMemcpyBatchAsync, 1),
	SYM(cuMemCreate, 2),
	SYM(cuMemRelease, 2),
	SYM(cuMemExportToShareableHandle, 2),
	SYM(cuMemImportFromShareableHandle, 2),
	SYM(cuMemAddressReserve, 2),
	SYM(cuMemAddressFree, 2),
	SYM(cuMemMap, 2),
	SYM(cuMemUnmap, 2),
	SYM(cuMemSetAccess, 2),
	SYM(cuMemGetAllocationGranularity, 2),
};

_Static_assert(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle is 64 bytes");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp is 32 bytes");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc is 12 bytes");
_Static_assert(sizeof(CUmemcpyAttributes) == 24, "CUmemcpyAttributes is 24 bytes");

int stage_nsyms(void) { return (int)(sizeof stage_syms / sizeof stage_syms[0]); }
const char *stage_sym_name(int i) { return stage_syms[i].name; }
/* 0 required, 1 optional (batch copies), 2 optional (VMM group). */
int stage_sym_optional(int i) { return stage_syms[i].optional; }
void stage_sym_set(stage_cu *l, int i, void *fp) { memcpy((char *)l + stage_syms[i].off, &fp, sizeof fp); }
stage_cu *stage_cu_new(void) { return (stage_cu *)calloc(1, sizeof(stage_cu)); }
void stage_cu_free(stage_cu *l) { free(l); }

/* Makes ctx current on this OS thread unless it already is. cuCtxGetCurrent
 * reads thread-local state, so the common case costs a few nanoseconds. */
static CUresult stage_ctx(const stage_cu *l, CUcontext ctx) {
	CUcontext cur = 0;
	if (l->cuCtxGetCurrent(&cur) == 0 && cur == ctx) return 0;
	return l->cuCtxSetCurrent(ctx);
}

#define CTX() do { CUresult r_ = stage_ctx(l, ctx); if (r_) return r_; } while (0)

CUresult stage_init(const stage_cu *l) { return l->cuInit(0); }
CUresult stage_driver_version(const stage_cu *l, int *v) { return l->cuDriverGetVersion(v); }

const char *stage_error_name(const stage_cu *l, CUresult r) {
	const char *s = 0;
	if (l->cuGetErrorName(r, &s) != 0) return 0;
	return s;
}

const char *stage_error_string(const stage_cu *l, CUresult r) {
	const char *s = 0;
	if (l->cuGetErrorString(r, &s) != 0) return 0;
	return s;
}

CUresult stage_device_get(const stage_cu *l, int ordinal, CUdevice *dev) { return l->cuDeviceGet(dev, ordinal); }
CUresult stage_device_count(const stage_cu *l, int *n) { return l->cuDeviceGetCount(n); }
CUresult stage_device_name(const stage_cu *l, CUdevice dev, char *buf, int len) { return l->cuDeviceGetName(buf, len, dev); }
CUresult stage_device_attr(const stage_cu *l, CUdevice dev, int attr, int *v) { return l->cuDeviceGetAttribute(v, attr, dev); }
CUresult stage_primary_retain(const stage_cu *l, CUdevice dev, CUcontext *ctx) { return l->cuDevicePrimaryCtxRetain(ctx, dev); }
CUresult stage_primary_release(const stage_cu *l, CUdevice dev) { return l->cuDevicePrimaryCtxRelease_v2(dev); }

CUresult stage_mem_alloc(const stage_cu *l, CUcontext ctx, size_t n, CUdeviceptr *p) { CTX(); return l->cuMemAlloc_v2(p, n); }
CUresult stage_mem_free(const stage_cu *l, CUcontext ctx, CUdeviceptr p) { CTX(); return l->cuMemFree_v2(p); }

CUresult stage_mem_range(const stage_cu *l, CUcontext ctx, CUdeviceptr p, CUdeviceptr *base, size_t *size) {
	CTX();
	return l->cuMemGetAddressRange_v2(base, size, p);
}

CUresult stage_host_alloc(const stage_cu *l, CUcontext ctx, size_t n, unsigned flags, void **host, CUdeviceptr *dev) {
	CTX();
	void *p = 0;
	CUresult r = l->cuMemHostAlloc(&p, n, flags);
	if (r) return r;
	r = l->cuMemHostGetDevicePointer_v2(dev, p, 0);
	if (r) {
		l->cuMemFreeHost(p);
		return r;
	}
	*host = p;
	return 0;
}

CUresult stage_host_free(const stage_cu *l, CUcontext ctx, void *host) { CTX(); return l->cuMemFreeHost(host); }

CUresult stage_host_register(const stage_cu *l, CUcontext ctx, uintptr_t host, size_t n, unsigned flags, CUdeviceptr *dev) {
	CTX();
	CUresult r = l->cuMemHostRegister_v2((void *)host, n, flags);
	if (r) return r;
	r = l->cuMemHostGetDevicePointer_v2(dev, (void *)host, 0);
	if (r) l->cuMemHostUnregister((void *)host);
	return r;
}

CUresult stage_host_unregister(const stage_cu *l, CUcontext ctx, uintptr_t host) { CTX(); return l->cuMemHostUnregister((void *)host); }
CUresult stage_copy_htod(const stage_cu *l, CUcontext ctx, CUdeviceptr dst, const void *src, size_t n) { CTX(); return l->cuMemcpyHtoD_v2(dst, src, n); }
CUresult stage_copy_dtoh(const stage_cu *l, CUcontext ctx, void *dst, CUdeviceptr src, size_t n) { CTX(); return l->cuMemcpyDtoH_v2(dst, src, n); }

CUresult stage_stream_create(const stage_cu *l, CUcontext ctx, unsigned flags, CUstream *s) { CTX(); return l->cuStreamCreate(s, flags); }
CUresult stage_stream_destroy(const stage_cu *l, CUcontext ctx, CUstream s) { CTX(); return l->cuStreamDestroy_v2(s); }
CUresult stage_stream_sync(const stage_cu *l, CUcontext ctx, CUstream s) { CTX(); return l->cuStreamSynchronize(s); }
CUresult stage_event_create(const stage_cu *l, CUcontext ctx, unsigned flags, CUevent *e) { CTX(); return l->cuEventCreate(e, flags); }
CUresult stage_event_destroy(const stage_cu *l, CUcontext ctx, CUevent e) { CTX(); return l->cuEventDestroy_v2(e); }
CUresult stage_event_record(const stage_cu *l, CUcontext ctx, CUevent e, CUstream s) { CTX(); return l->cuEventRecord(e, s); }
CUresult stage_event_query(const stage_cu *l, CUcontext ctx, CUevent e) { CTX(); return l->cuEventQuery(e); }
CUresult stage_event_sync(const stage_cu *l, CUcontext ctx, CUevent e) { CTX(); return l->cuEventSynchronize(e); }

/* Polls cuEventQuery for at most spin_ns, then blocks in cuEventSynchronize
 * (which sleeps when the event was made with CU_EVENT_BLOCKING_SYNC). Short
 * copies finish inside the spin and pay no wake-up; long ones cost no CPU. */
CUresult stage_event_wait(const stage_cu *l, CUcontext ctx, CUevent e, int64_t spin_ns) {
	CTX();
	if (spin_ns > 0) {
		struct timespec t0, t;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (;;) {
			CUresult r = l->cuEventQuery(e);
			if (r != 600 /* CUDA_ERROR_NOT_READY */) return r;
			clock_gettime(CLOCK_MONOTONIC, &t);
			if ((int64_t)(t.tv_sec - t0.tv_sec) * 1000000000 + (t.tv_nsec - t0.tv_nsec) >= spin_ns) break;
		}
	}
	return l->cuEventSynchronize(e);
}

CUresult stage_dtoh_async(const stage_cu *l, CUcontext ctx, uintptr_t dst, CUdeviceptr src, size_t n, CUstream s) {
	CTX();
	return l->cuMemcpyDtoHAsync_v2((void *)dst, src, n, s);
}

CUresult stage_htod_async(const stage_cu *l, CUcontext ctx, CUdeviceptr dst, uintptr_t src, size_t n, CUstream s) {
	CTX();
	return l->cuMemcpyHtoDAsync_v2(dst, (const void *)src, n, s);
}

CUresult stage_dtod_async(const stage_cu *l, CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	CTX();
	return l->cuMemcpyDtoDAsync_v2(dst, src, n, s);
}

stage_scratch *stage_scratch_new(void) {
	stage_scratch *sc = (stage_scratch *)calloc(1, sizeof *sc);
	if (!sc) return 0;
	sc->attr.srcAccessOrder = 1; /* CU_MEMCPY_SRC_ACCESS_ORDER_STREAM */
	sc->attr_idx = 0;
	return sc;
}

int stage_scratch_reserve(stage_scratch *sc, size_t n) {
	if (n <= sc->cap) return 0;
	size_t c = sc->cap ? sc->cap : 256;
	while (c < n) c *= 2;
	CUdeviceptr *d = (CUdeviceptr *)realloc(sc->dsts, c * sizeof *d);
	if (!d) return -1;
	sc->dsts = d;
	CUdeviceptr *s = (CUdeviceptr *)realloc(sc->srcs, c * sizeof *s);
	if (!s) return -1;
	sc->srcs = s;
	size_t *z = (size_t *)realloc(sc->sizes, c * sizeof *z);
	if (!z) return -1;
	sc->sizes = z;
	sc->cap = c;
	return 0;
}

void stage_scratch_free(stage_scratch *sc) {
	if (!sc) return;
	free(sc->dsts);
	free(sc->srcs);
	free(sc->sizes);
	free(sc);
}

CUresult stage_batch(const stage_cu *l, CUcontext ctx, stage_scratch *sc, size_t count, CUstream s) {
	CTX();
	sc->fail = (size_t)-1;
	if (l->cuMemcpyBatchAsync_v2)
		return l->cuMemcpyBatchAsync_v2(sc->dsts, sc->srcs, sc->sizes, count, &sc->attr, &sc->attr_idx, 1, s);
	return l->cuMemcpyBatchAsync(sc->dsts, sc->srcs, sc->sizes, count, &sc->attr, &sc->attr_idx, 1, &sc->fail, s);
}

CUresult stage_percopy(const stage_cu *l, CUcontext ctx, int dir, stage_scratch *sc, size_t count, CUstream s) {
	CTX();
	for (size_t i = 0; i < count; i++) {
		CUresult r = dir == 0
			? l->cuMemcpyDtoHAsync_v2((void *)(uintptr_t)sc->dsts[i], sc->srcs[i], sc->sizes[i], s)
			: dir == 1 ? l->cuMemcpyHtoDAsync_v2(sc->dsts[i], (const void *)(uintptr_t)sc->srcs[i], sc->sizes[i], s)
			: l->cuMemcpyDtoDAsync_v2(sc->dsts[i], sc->srcs[i], sc->sizes[i], s);
		if (r) {
			sc->fail = i;
			return r;
		}
	}
	return 0;
}

CUresult stage_module_load(const stage_cu *l, CUcontext ctx, const char *image, const char *fname,
                           CUmodule *mod, CUfunction *fn) {
	CTX();
	CUresult r = l->cuModuleLoadData(mod, image);
	if (r) return r;
	r = l->cuModuleGetFunction(fn, *mod, fname);
	if (r) {
		l->cuModuleUnload(*mod);
		*mod = 0;
	}
	return r;
}

CUresult stage_module_unload(const stage_cu *l, CUcontext ctx, CUmodule mod) { CTX(); return l->cuModuleUnload(mod); }
CUresult stage_module_function(const stage_cu *l, CUcontext ctx, CUmodule mod, const char *fname, CUfunction *fn) {
	CTX();
	return l->cuModuleGetFunction(fn, mod, fname);
}

stage_launch_result stage_launch_copy(const stage_cu *l, CUcontext ctx, CUfunction fn, CUdeviceptr descs,
                                      unsigned count, unsigned grid, unsigned block, CUstream s, CUevent ev) {
	stage_launch_result res = { 0, 0 };
	res.rc = stage_ctx(l, ctx);
	if (res.rc) return res;
	void *params[2] = { &descs, &count };
	res.rc = l->cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, s, params, 0);
	if (res.rc) return res;
	res.step = 1;
	res.rc = l->cuEventRecord(ev, s);
	return res;
}

CUresult stage_ipc_get(const stage_cu *l, CUcontext ctx, CUdeviceptr p, char *out64) {
	CTX();
	CUipcMemHandle h;
	memset(&h, 0, sizeof h);
	CUresult r = l->cuIpcGetMemHandle(&h, p);
	if (r == 0) memcpy(out64, h.reserved, sizeof h.reserved);
	return r;
}

CUresult stage_ipc_open(const stage_cu *l, CUcontext ctx, const char *h64, unsigned flags, CUdeviceptr *p) {
	CTX();
	CUipcMemHandle h;
	memcpy(h.reserved, h64, sizeof h.reserved);
	return l->cuIpcOpenMemHandle_v2(p, h, flags); /* by value */
}

CUresult stage_ipc_close(const stage_cu *l, CUcontext ctx, CUdeviceptr p) { CTX(); return l->cuIpcCloseMemHandle(p); }

CUresult stage_vmm_setup(const stage_cu *l, CUcontext ctx, int ordinal, int handle_types, int fd,
                         size_t *size, CUmemGenericAllocationHandle *h, CUdeviceptr *p, int *step) {
	CTX();
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof prop);
	prop.type = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
	prop.requestedHandleTypes = handle_types;
	prop.location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
	prop.location.id = ordinal;

	size_t gran = 0;
	*step = STAGE_VMM_GRANULARITY;
	CUresult r = l->cuMemGetAllocationGranularity(&gran, &prop, 0 /* MINIMUM */);
	if (r) return r;
	if (gran == 0) gran = 1;
	size_t n = (*size + gran - 1) / gran * gran;

	CUmemGenericAllocationHandle ah = 0;
	if (fd < 0) {
		*step = STAGE_VMM_CREATE;
		r = l->cuMemCreate(&ah, n, &prop, 0);
	} else {
		*step = STAGE_VMM_IMPORT;
		r = l->cuMemImportFromShareableHandle(&ah, (void *)(uintptr_t)fd, 1 /* POSIX_FILE_DESCRIPTOR */);
	}
	if (r) return r;

	CUdeviceptr va = 0;
	*step = STAGE_VMM_RESERVE;
	r = l->cuMemAddressReserve(&va, n, gran, 0, 0);
	if (r) goto release;

	*step = STAGE_VMM_MAP;
	r = l->cuMemMap(va, n, 0, ah, 0);
	if (r) goto addrfree;

	CUmemAccessDesc acc;
	memset(&acc, 0, sizeof acc);
	acc.location.type = 1;
	acc.location.id = ordinal;
	acc.flags = 3; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
	*step = STAGE_VMM_ACCESS;
	r = l->cuMemSetAccess(va, n, &acc, 1);
	if (r) goto unmap;

	*size = n;
	*h = ah;
	*p = va;
	return 0;

unmap:
	l->cuMemUnmap(va, n);
addrfree:
	l->cuMemAddressFree(va, n);
release:
	l->cuMemRelease(ah);
	return r;
}

CUresult stage_vmm_teardown(const stage_cu *l, CUcontext ctx, CUdeviceptr p, size_t size,
                            CUmemGenericAllocationHandle h, int *step) {
	CTX();
	CUresult first = 0;
	CUresult r = l->cuMemUnmap(p, size);
	if (r && !first) { first = r; *step = STAGE_VMM_UNMAP; }
	r = l->cuMemAddressFree(p, size);
	if (r && !first) { first = r; *step = STAGE_VMM_ADDRFREE; }
	r = l->cuMemRelease(h);
	if (r && !first) { first = r; *step = STAGE_VMM_RELEASE; }
	return first;
}

CUresult stage_vmm_export_fd(const stage_cu *l, CUcontext ctx, CUmemGenericAllocationHandle h, int *fd) {
	CTX();
	return l->cuMemExportToShareableHandle(fd, h, 1 /* POSIX_FILE_DESCRIPTOR */, 0);
}
