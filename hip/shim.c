/* shim.c: symbol table and trampolines of the hip backend (see shim.h). */
#include "shim.h"

#include <stdlib.h>
#include <string.h>

#define SYM(name, group) { #name, group, offsetof(sthip_hip, name) }

static const struct {
	const char *name;
	int group;
	size_t off;
} sthip_syms[] = {
	SYM(hipInit, STHIP_SYM_REQUIRED),
	SYM(hipGetErrorName, STHIP_SYM_REQUIRED),
	SYM(hipGetErrorString, STHIP_SYM_REQUIRED),
	SYM(hipGetDeviceCount, STHIP_SYM_REQUIRED),
	SYM(hipSetDevice, STHIP_SYM_REQUIRED),
	SYM(hipGetDevice, STHIP_SYM_REQUIRED),
	SYM(hipMalloc, STHIP_SYM_REQUIRED),
	SYM(hipFree, STHIP_SYM_REQUIRED),
	SYM(hipHostMalloc, STHIP_SYM_REQUIRED),
	SYM(hipHostFree, STHIP_SYM_REQUIRED),
	SYM(hipHostGetDevicePointer, STHIP_SYM_REQUIRED),
	SYM(hipMemGetAddressRange, STHIP_SYM_REQUIRED),
	SYM(hipMemcpy, STHIP_SYM_REQUIRED),
	SYM(hipMemcpyAsync, STHIP_SYM_REQUIRED),
	SYM(hipStreamCreateWithFlags, STHIP_SYM_REQUIRED),
	SYM(hipStreamDestroy, STHIP_SYM_REQUIRED),
	SYM(hipStreamSynchronize, STHIP_SYM_REQUIRED),
	SYM(hipEventCreateWithFlags, STHIP_SYM_REQUIRED),
	SYM(hipEventRecord, STHIP_SYM_REQUIRED),
	SYM(hipEventQuery, STHIP_SYM_REQUIRED),
	SYM(hipEventSynchronize, STHIP_SYM_REQUIRED),
	SYM(hipEventDestroy, STHIP_SYM_REQUIRED),
	SYM(hipIpcGetMemHandle, STHIP_SYM_REQUIRED),
	SYM(hipIpcOpenMemHandle, STHIP_SYM_REQUIRED),
	SYM(hipIpcCloseMemHandle, STHIP_SYM_REQUIRED),
	SYM(hipDeviceEnablePeerAccess, STHIP_SYM_OPTIONAL),
};

_Static_assert(sizeof(hipIpcMemHandle_t) == 64, "hipIpcMemHandle_t is 64 bytes");
_Static_assert(sizeof(sthip_seg) == 16, "sthip_seg matches device.Seg");

int sthip_nsyms(void) { return (int)(sizeof sthip_syms / sizeof sthip_syms[0]); }
const char *sthip_sym_name(int i) { return sthip_syms[i].name; }
int sthip_sym_group(int i) { return sthip_syms[i].group; }
void sthip_sym_set(sthip_hip *l, int i, void *fp) { memcpy((char *)l + sthip_syms[i].off, &fp, sizeof fp); }
sthip_hip *sthip_hip_new(void) { return (sthip_hip *)calloc(1, sizeof(sthip_hip)); }
void sthip_hip_free(sthip_hip *l) { free(l); }

/* ret packs rc with the runtime's text for it. */
static sthip_ret ret(const sthip_hip *l, hipError_t rc) {
	sthip_ret r = { rc, 0, 0 };
	if (rc != 0) {
		r.name = l->hipGetErrorName(rc);
		r.msg = l->hipGetErrorString(rc);
	}
	return r;
}

/* sthip_use makes dev the calling thread's current device unless it
 * already is: goroutines move between OS threads, and each thread has its
 * own current device (0 until set). */
static hipError_t sthip_use(const sthip_hip *l, int dev) {
	int cur = -1;
	if (l->hipGetDevice(&cur) == 0 && cur == dev) return 0;
	return l->hipSetDevice(dev);
}

#define USE() do { hipError_t r_ = sthip_use(l, dev); if (r_) return ret(l, r_); } while (0)

enum { KIND_H2D = 1, KIND_D2H = 2, KIND_D2D = 3 };

sthip_ret sthip_init(const sthip_hip *l) { return ret(l, l->hipInit(0)); }
sthip_ret sthip_device_count(const sthip_hip *l, int *n) { return ret(l, l->hipGetDeviceCount(n)); }
sthip_ret sthip_describe(const sthip_hip *l, hipError_t rc) { return ret(l, rc); }

sthip_ret sthip_malloc(const sthip_hip *l, int dev, size_t n, uintptr_t *p) {
	USE();
	void *q = 0;
	hipError_t rc = l->hipMalloc(&q, n);
	if (rc == 0) *p = (uintptr_t)q;
	return ret(l, rc);
}

sthip_ret sthip_free(const sthip_hip *l, int dev, uintptr_t p) { USE(); return ret(l, l->hipFree((void *)p)); }

sthip_ret sthip_host_alloc(const sthip_hip *l, int dev, size_t n, unsigned int flags, void **host,
                           uintptr_t *devp, int *step) {
	*step = 0;
	USE();
	void *h = 0;
	hipError_t rc = l->hipHostMalloc(&h, n, flags);
	if (rc) return ret(l, rc);
	*step = 1;
	void *d = 0;
	rc = l->hipHostGetDevicePointer(&d, h, 0);
	if (rc) {
		sthip_ret r = ret(l, rc);
		l->hipHostFree(h);
		return r;
	}
	*host = h;
	*devp = (uintptr_t)d;
	return ret(l, 0);
}

sthip_ret sthip_host_free(const sthip_hip *l, int dev, void *host) { USE(); return ret(l, l->hipHostFree(host)); }

sthip_ret sthip_mem_range(const sthip_hip *l, int dev, uintptr_t p, uintptr_t *base, size_t *size) {
	USE();
	void *b = 0;
	size_t n = 0;
	hipError_t rc = l->hipMemGetAddressRange(&b, &n, (void *)p);
	if (rc == 0) {
		*base = (uintptr_t)b;
		*size = n;
	}
	return ret(l, rc);
}

sthip_ret sthip_copy_h2d(const sthip_hip *l, int dev, uintptr_t dst, const void *src, size_t n) {
	USE();
	return ret(l, l->hipMemcpy((void *)dst, src, n, KIND_H2D));
}

sthip_ret sthip_copy_d2h(const sthip_hip *l, int dev, void *dst, uintptr_t src, size_t n) {
	USE();
	return ret(l, l->hipMemcpy(dst, (const void *)src, n, KIND_D2H));
}

sthip_ret sthip_enable_peer(const sthip_hip *l, int dev, int peer) {
	USE();
	return ret(l, l->hipDeviceEnablePeerAccess(peer, 0));
}

sthip_ret sthip_stream_create(const sthip_hip *l, int dev, unsigned int flags, hipStream_t *s) {
	USE();
	return ret(l, l->hipStreamCreateWithFlags(s, flags));
}

sthip_ret sthip_stream_destroy(const sthip_hip *l, int dev, hipStream_t s) { USE(); return ret(l, l->hipStreamDestroy(s)); }
sthip_ret sthip_stream_sync(const sthip_hip *l, int dev, hipStream_t s) { USE(); return ret(l, l->hipStreamSynchronize(s)); }

sthip_ret sthip_event_create(const sthip_hip *l, int dev, unsigned int flags, hipEvent_t *e) {
	USE();
	return ret(l, l->hipEventCreateWithFlags(e, flags));
}

sthip_ret sthip_event_destroy(const sthip_hip *l, int dev, hipEvent_t e) { USE(); return ret(l, l->hipEventDestroy(e)); }
sthip_ret sthip_event_record(const sthip_hip *l, int dev, hipEvent_t e, hipStream_t s) { USE(); return ret(l, l->hipEventRecord(e, s)); }
sthip_ret sthip_event_query(const sthip_hip *l, int dev, hipEvent_t e) { USE(); return ret(l, l->hipEventQuery(e)); }
sthip_ret sthip_event_sync(const sthip_hip *l, int dev, hipEvent_t e) { USE(); return ret(l, l->hipEventSynchronize(e)); }

sthip_ret sthip_move(const sthip_hip *l, int dev, hipStream_t s, int kind, uintptr_t host,
                     const sthip_seg *segs, size_t n, size_t *idx, int *drained) {
	*idx = 0;
	*drained = 0;
	USE();
	uintptr_t off = host;
	for (size_t i = 0; i < n; i++) {
		void *d = (void *)(uintptr_t)segs[i].addr;
		size_t len = (size_t)segs[i].len;
		hipError_t rc = kind == KIND_D2H ? l->hipMemcpyAsync((void *)off, d, len, KIND_D2H, s)
		                                 : l->hipMemcpyAsync(d, (const void *)off, len, KIND_H2D, s);
		if (rc) {
			sthip_ret r = ret(l, rc);
			*idx = i;
			if (i > 0) {
				/* Copies already queued touch the slot: let them
				 * finish before the caller may reuse it. Their own
				 * error, if any, is the stream's; ours is reported. */
				l->hipStreamSynchronize(s);
				*drained = 1;
			}
			return r;
		}
		off += len;
	}
	return ret(l, 0);
}

sthip_ret sthip_copy_d2d_async(const sthip_hip *l, int dev, hipStream_t s, uintptr_t dst, uintptr_t src, size_t n) {
	USE();
	return ret(l, l->hipMemcpyAsync((void *)dst, (const void *)src, n, KIND_D2D, s));
}

sthip_ret sthip_ipc_get(const sthip_hip *l, int dev, uintptr_t p, char *handle64) {
	USE();
	hipIpcMemHandle_t h;
	memset(&h, 0, sizeof h);
	hipError_t rc = l->hipIpcGetMemHandle(&h, (void *)p);
	if (rc == 0) memcpy(handle64, h.reserved, sizeof h.reserved);
	return ret(l, rc);
}

sthip_ret sthip_ipc_open(const sthip_hip *l, int dev, const char *handle64, unsigned int flags, uintptr_t *p) {
	USE();
	hipIpcMemHandle_t h;
	memcpy(h.reserved, handle64, sizeof h.reserved);
	void *q = 0;
	hipError_t rc = l->hipIpcOpenMemHandle(&q, h, flags); /* by value */
	if (rc == 0) *p = (uintptr_t)q;
	return ret(l, rc);
}

sthip_ret sthip_ipc_close(const sthip_hip *l, int dev, uintptr_t p) { USE(); return ret(l, l->hipIpcCloseMemHandle((void *)p)); }
