/* fakecuda.c: a stand-in for libcuda.so.1 that the CPU-only tests build with
 * gcc. "Device memory" is host memory, copies are memmove done at enqueue
 * time, and the copy kernel is emulated by reading its descriptors. It checks
 * what the real driver would reject: calls without a current context, a
 * wrong block size, PTX without the kernel's entry. Build flags:
 *   -DFAKE_NO_BATCH   do not export cuMemcpyBatchAsync_v2
 * Environment (read by cuInit):
 *   FAKECUDA_INIT_ERR=N   cuInit returns N
 *   FAKECUDA_PENDING=N    an event reports NOT_READY N times after each record
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

#define OK 0
#define INVALID_VALUE 1
#define OUT_OF_MEMORY 2
#define NO_DEVICE 100
#define INVALID_CONTEXT 201
#define INVALID_PTX 218
#define NOT_FOUND 500
#define NOT_READY 600
#define NOT_SUPPORTED 801
#define HOST_MEMORY_ALREADY_REGISTERED 712
#define HOST_MEMORY_NOT_REGISTERED 713

static struct { int code; const char *name, *msg; } errs[] = {
	{ OK, "CUDA_SUCCESS", "no error" },
	{ INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed" },
	{ NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
	{ NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped" },
	{ HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region" },
};

CUresult cuGetErrorName(CUresult r, const char **s) {
	for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
		if (errs[i].code == r) { *s = errs[i].name; return OK; }
	return INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
	for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
		if (errs[i].code == r) { *s = errs[i].msg; return OK; }
	return INVALID_VALUE;
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized, pending_after_record;
static int ctx_object, ctx_refs;
static __thread void *current;
static long live_allocs, live_host, live_registered, live_streams, live_events, live_modules, launches, ctx_sets;

#define NEED_CTX() do { if (current != &ctx_object) return INVALID_CONTEXT; } while (0)

/* fake_live: resources not yet freed, for leak checks. */
long fake_live(void) {
	pthread_mutex_lock(&mu);
	long n = live_allocs + live_host + live_registered + live_streams + live_events + live_modules + ctx_refs;
	pthread_mutex_unlock(&mu);
	return n;
}
long fake_launches(void) { return launches; }
long fake_ctx_sets(void) { return ctx_sets; }

CUresult cuInit(unsigned flags) {
	(void)flags;
	const char *e = getenv("FAKECUDA_INIT_ERR");
	if (e && atoi(e)) return atoi(e);
	const char *p = getenv("FAKECUDA_PENDING");
	pending_after_record = p ? atoi(p) : 0;
	initialized = 1;
	return OK;
}

CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { if (!initialized) return 3; *n = 1; return OK; }
CUresult cuDeviceGet(int *d, int ordinal) { if (ordinal != 0) return 101; *d = 0; return OK; }
CUresult cuDeviceGetName(char *buf, int len, int d) { (void)d; strncpy(buf, "Fake GPU", len); return OK; }

CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
	(void)d;
	switch (attr) {
	case 16: *v = 4; return OK;
	case 75: *v = 9; return OK;
	case 76: *v = 0; return OK;
	}
	*v = 0;
	return OK;
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, int d) {
	(void)d;
	pthread_mutex_lock(&mu);
	ctx_refs++;
	pthread_mutex_unlock(&mu);
	*ctx = &ctx_object;
	return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(int d) {
	(void)d;
	pthread_mutex_lock(&mu);
	CUresult r = ctx_refs > 0 ? OK : INVALID_CONTEXT;
	if (ctx_refs > 0) ctx_refs--;
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult cuCtxSetCurrent(void *ctx) { current = ctx; __atomic_add_fetch(&ctx_sets, 1, __ATOMIC_RELAXED); return OK; }
CUresult cuCtxGetCurrent(void **ctx) { *ctx = current; return OK; }

/* Allocation table for cuMemGetAddressRange. */
struct alloc { uintptr_t p; size_t n; struct alloc *next; };
static struct alloc *allocs;

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CTX();
	if (n > ((size_t)1 << 40)) return OUT_OF_MEMORY;
	void *m = aligned_alloc(256, (n + 255) / 256 * 256);
	if (!m) return OUT_OF_MEMORY;
	struct alloc *a = malloc(sizeof *a);
	a->p = (uintptr_t)m;
	a->n = n;
	pthread_mutex_lock(&mu);
	a->next = allocs;
	allocs = a;
	live_allocs++;
	pthread_mutex_unlock(&mu);
	*p = (CUdeviceptr)(uintptr_t)m;
	return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	for (struct alloc **a = &allocs; *a; a = &(*a)->next) {
		if ((*a)->p == (uintptr_t)p) {
			struct alloc *x = *a;
			*a = x->next;
			free(x);
			live_allocs--;
			pthread_mutex_unlock(&mu);
			free((void *)(uintptr_t)p);
			return OK;
		}
	}
	pthread_mutex_unlock(&mu);
	return INVALID_VALUE;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	for (struct alloc *a = allocs; a; a = a->next) {
		if ((uintptr_t)p >= a->p && (uintptr_t)p < a->p + a->n) {
			*base = a->p;
			*size = a->n;
			pthread_mutex_unlock(&mu);
			return OK;
		}
	}
	pthread_mutex_unlock(&mu);
	return NOT_FOUND;
}

CUresult cuMemHostAlloc(void **pp, size_t n, unsigned flags) {
	NEED_CTX();
	if (flags != 3) return INVALID_VALUE;
	void *m = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
	if (!m) return OUT_OF_MEMORY;
	__atomic_add_fetch(&live_host, 1, __ATOMIC_RELAXED);
	*pp = m;
	return OK;
}

CUresult cuMemFreeHost(void *p) { NEED_CTX(); free(p); __atomic_sub_fetch(&live_host, 1, __ATOMIC_RELAXED); return OK; }
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) { NEED_CTX(); (void)flags; *d = (CUdeviceptr)(uintptr_t)p; return OK; }

/* Registered ranges, so that registering a range twice (or a range that
 * overlaps one) and unregistering what is not registered fail as they do
 * with the driver: renewing a slot must unregister it first. */
static struct reg { uintptr_t p; size_t n; struct reg *next; } *regs;

CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
	NEED_CTX();
	if (flags != 3 || !p || !n) return INVALID_VALUE;
	uintptr_t a = (uintptr_t)p;
	pthread_mutex_lock(&mu);
	for (struct reg *r = regs; r; r = r->next) {
		if (a < r->p + r->n && r->p < a + n) {
			pthread_mutex_unlock(&mu);
			return HOST_MEMORY_ALREADY_REGISTERED;
		}
	}
	struct reg *r = malloc(sizeof *r);
	if (!r) { pthread_mutex_unlock(&mu); return OUT_OF_MEMORY; }
	r->p = a; r->n = n; r->next = regs; regs = r;
	pthread_mutex_unlock(&mu);
	__atomic_add_fetch(&live_registered, 1, __ATOMIC_RELAXED);
	return OK;
}

CUresult cuMemHostUnregister(void *p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	for (struct reg **rp = &regs; *rp; rp = &(*rp)->next) {
		if ((*rp)->p == (uintptr_t)p) {
			struct reg *r = *rp;
			*rp = r->next;
			free(r);
			pthread_mutex_unlock(&mu);
			__atomic_sub_fetch(&live_registered, 1, __ATOMIC_RELAXED);
			return OK;
		}
	}
	pthread_mutex_unlock(&mu);
	return HOST_MEMORY_NOT_REGISTERED;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { NEED_CTX(); memmove((void *)(uintptr_t)d, s, n); return OK; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { NEED_CTX(); memmove(d, (void *)(uintptr_t)s, n); return OK; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) { NEED_CTX(); if (!st) return INVALID_VALUE; memmove((void *)(uintptr_t)d, s, n); return OK; }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { NEED_CTX(); if (!st) return INVALID_VALUE; memmove(d, (void *)(uintptr_t)s, n); return OK; }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { NEED_CTX(); if (!st) return INVALID_VALUE; memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n); return OK; }

CUresult cuStreamCreate(void **s, unsigned flags) {
	NEED_CTX();
	if (flags != 1) return INVALID_VALUE;
	*s = malloc(16);
	__atomic_add_fetch(&live_streams, 1, __ATOMIC_RELAXED);
	return OK;
}

CUresult cuStreamDestroy_v2(void *s) { NEED_CTX(); free(s); __atomic_sub_fetch(&live_streams, 1, __ATOMIC_RELAXED); return OK; }
CUresult cuStreamSynchronize(void *s) { NEED_CTX(); (void)s; return OK; }

struct event { int pending; };

CUresult cuEventCreate(void **e, unsigned flags) {
	NEED_CTX();
	if (flags & ~3u) return INVALID_VALUE; /* DISABLE_TIMING (2) and BLOCKING_SYNC (1) only */
	*e = calloc(1, sizeof(struct event));
	__atomic_add_fetch(&live_events, 1, __ATOMIC_RELAXED);
	return OK;
}

CUresult cuEventDestroy_v2(void *e) { NEED_CTX(); free(e); __atomic_sub_fetch(&live_events, 1, __ATOMIC_RELAXED); return OK; }
CUresult cuEventRecord(void *e, void *s) { NEED_CTX(); if (!s) return INVALID_VALUE; ((struct event *)e)->pending = pending_after_record; return OK; }

CUresult cuEventQuery(void *e) {
	NEED_CTX();
	struct event *ev = e;
	if (ev->pending > 0) { ev->pending--; return NOT_READY; }
	return OK;
}

CUresult cuEventSynchronize(void *e) { NEED_CTX(); ((struct event *)e)->pending = 0; return OK; }

/* Two module objects: one whose PTX declares only the plain kernel, one
 * that declares the strided kernel too (cuModuleGetFunction finds it only
 * there, as the driver would). */
static int module_object, module_strided, function_object, function_strided;

CUresult cuModuleLoadData(void **m, const void *image) {
	NEED_CTX();
	if (!image || !strstr((const char *)image, ".entry stage_copy_segments")) return INVALID_PTX;
	__atomic_add_fetch(&live_modules, 1, __ATOMIC_RELAXED);
	*m = strstr((const char *)image, ".entry stage_copy_strided") ? (void *)&module_strided : (void *)&module_object;
	return OK;
}

CUresult cuModuleUnload(void *m) { NEED_CTX(); (void)m; __atomic_sub_fetch(&live_modules, 1, __ATOMIC_RELAXED); return OK; }

CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
	NEED_CTX();
	if (m != &module_object && m != &module_strided) return NOT_FOUND;
	if (strcmp(name, "stage_copy_segments") == 0) {
		*f = &function_object;
		return OK;
	}
	if (m == &module_strided && strcmp(name, "stage_copy_strided") == 0) {
		*f = &function_strided;
		return OK;
	}
	return NOT_FOUND;
}

struct desc { unsigned long long src, dst, len; };
struct sdesc {
	unsigned long long src, dst, src1, dst1, src2, dst2;
	unsigned len, n1, n2, pad;
};

static long strided_launches, strided_pieces;
long fake_strided_launches(void) { return strided_launches; }
long fake_strided_pieces(void) { return strided_pieces; }

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shm, void *st, void **params, void **extra) {
	NEED_CTX();
	(void)shm;
	if ((f != &function_object && f != &function_strided) || !st || !params || extra) return INVALID_VALUE;
	if (gx == 0 || gx > 65535 || gy != 1 || gz != 1 || bx != 256 || by != 1 || bz != 1) return INVALID_VALUE;
	unsigned count = *(const unsigned *)params[1];
	if (f == &function_strided) {
		const struct sdesc *d = *(const struct sdesc **)params[0];
		for (unsigned i = 0; i < count; i++)
			for (unsigned long long i2 = 0; i2 < d[i].n2; i2++)
				for (unsigned long long i1 = 0; i1 < d[i].n1; i1++) {
					memmove((void *)(uintptr_t)(d[i].dst + i2 * d[i].dst2 + i1 * d[i].dst1),
					        (const void *)(uintptr_t)(d[i].src + i2 * d[i].src2 + i1 * d[i].src1), d[i].len);
					__atomic_add_fetch(&strided_pieces, 1, __ATOMIC_RELAXED);
				}
		__atomic_add_fetch(&strided_launches, 1, __ATOMIC_RELAXED);
	} else {
		const struct desc *d = *(const struct desc **)params[0];
		for (unsigned i = 0; i < count; i++)
			memmove((void *)(uintptr_t)d[i].dst, (const void *)(uintptr_t)d[i].src, d[i].len);
	}
	__atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
	return OK;
}

/* Legacy IPC: the handle carries a magic and the base address; opening it
 * "maps" the same memory at the same address. */
typedef struct { char reserved[64]; } CUipcMemHandle;

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
	NEED_CTX();
	CUdeviceptr base;
	size_t n;
	if (cuMemGetAddressRange_v2(&base, &n, p) != OK || base != p) return INVALID_VALUE;
	memset(h, 0, sizeof *h);
	memcpy(h->reserved, "FAKEIPC", 8);
	memcpy(h->reserved + 8, &p, sizeof p);
	return OK;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned flags) {
	NEED_CTX();
	if (flags != 1 || memcmp(h.reserved, "FAKEIPC", 8) != 0) return INVALID_VALUE;
	memcpy(p, h.reserved + 8, sizeof *p);
	__atomic_add_fetch(&live_allocs, 1, __ATOMIC_RELAXED);
	return OK;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) { NEED_CTX(); (void)p; __atomic_sub_fetch(&live_allocs, 1, __ATOMIC_RELAXED); return OK; }

#ifndef FAKE_NO_BATCH
typedef struct { int order; int a, b, c, d; unsigned flags; } CUmemcpyAttributes;

CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                               CUmemcpyAttributes *attrs, size_t *idxs, size_t nattrs, void *st) {
	NEED_CTX();
	if (!st || nattrs != 1 || idxs[0] != 0 || attrs[0].order != 1) return INVALID_VALUE;
	for (size_t i = 0; i < count; i++)
		memmove((void *)(uintptr_t)dsts[i], (const void *)(uintptr_t)srcs[i], sizes[i]);
	return OK;
}
#endif
