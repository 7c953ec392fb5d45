/* fakeacl_cuda.c: the same emulation of libascendcl as fakeacl.c, but over
 * the CUDA runtime, for the GPU tests: "NPU memory" is real GPU memory
 * (cudaMalloc), pinned host memory is cudaHostAlloc'd, streams are
 * non-blocking cudaStreams, events are cudaEvents, copies are
 * cudaMemcpyAsync. It lets the acl backend run its real data path (async
 * copies from pinned memory, events, IPC across processes) against a real
 * accelerator. Build on a CUDA machine:
 *
 *   nvcc -shared -Xcompiler -fPIC -o libascendcl.so fakeacl_cuda.c -lpthread -lcuda
 *
 * CUDA runtime and driver prototypes are declared here by hand (no CUDA
 * header needed to compile; link with cudart and, for the VMM calls, the
 * driver: -lcuda; -DFAKEACL_NO_VMM leaves them out).
 *
 * IPC: an export key (at most 64 characters) cannot carry the 64-byte
 * cudaIpcMemHandle in hex, so it names a one-page memfd of the exporter,
 * as /proc/<pid>/fd/<fd>, that holds the handle, the offset, the pid
 * whitelist and the importer count.
 *
 * Differences from fakeacl.c: aclrtMemcpyBatchAsync is a loop of
 * cudaMemcpyAsync (CUDA 12.8's batched copy has a different ABI per
 * version); the device view of registered host memory is CUDA's mapped
 * pointer (equal to the host pointer under UVA), so misuse of it is not
 * caught here. Environment: FAKEACL_FAIL_COPY=N, FAKEACL_BATCH_UNSUPPORTED=1
 * as in fakeacl.c. */
#define _GNU_SOURCE
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

/* ---- the CUDA runtime, by hand ---- */
typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef struct { char reserved[64]; } cudaIpcMemHandle_t;
cudaError_t cudaSetDevice(int);
cudaError_t cudaGetDeviceCount(int *);
cudaError_t cudaMalloc(void **, size_t);
cudaError_t cudaFree(void *);
cudaError_t cudaHostAlloc(void **, size_t, unsigned);
cudaError_t cudaFreeHost(void *);
cudaError_t cudaHostRegister(void *, size_t, unsigned);
cudaError_t cudaHostUnregister(void *);
cudaError_t cudaHostGetDevicePointer(void **, void *, unsigned);
cudaError_t cudaMemcpy(void *, const void *, size_t, int);
cudaError_t cudaMemcpyAsync(void *, const void *, size_t, int, cudaStream_t);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *, unsigned);
cudaError_t cudaStreamDestroy(cudaStream_t);
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaStreamQuery(cudaStream_t);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *, unsigned);
cudaError_t cudaEventDestroy(cudaEvent_t);
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t);
cudaError_t cudaEventQuery(cudaEvent_t);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *, void *);
cudaError_t cudaIpcOpenMemHandle(void **, cudaIpcMemHandle_t, unsigned);
cudaError_t cudaIpcCloseMemHandle(void *);
const char *cudaGetErrorString(cudaError_t);
#define cudaErrorMemoryAllocation 2
#define cudaErrorNotReady 600
#define cudaHostAllocPortable 1
#define cudaHostAllocMapped 2
#define cudaHostRegisterPortable 1
#define cudaHostRegisterMapped 2
#define cudaStreamNonBlocking 1
#define cudaEventDisableTiming 2
#define cudaIpcMemLazyEnablePeerAccess 1

#define FAKE_NAME "fakeacl_cuda"
#define FAKE_NCTX 16
#define FAKE_BIND(dev) cu(cudaSetDevice(dev), "cudaSetDevice")
static int cu(cudaError_t e, const char *what);
#include "fakeacl_common.h"

#define MAGIC 0x55434c46u

/* cu maps a CUDA error onto an aclError with CUDA's text. */
static aclError cu(cudaError_t e, const char *what) {
	if (e == 0) return OK;
	return fail(e == cudaErrorMemoryAllocation ? E_MEM_ALLOC : E_DRV, "fakeacl_cuda: %s: CUDA error %d: %s", what, e, cudaGetErrorString(e));
}

static int initialized, ndev, batch_unsupported;
static long fail_copy_at, n_copies, n_batch, n_d2d, n_legacy_query, n_streams, n_events;

aclError aclInit(const char *cfg) {
	(void)cfg;
	pthread_mutex_lock(&mu);
	int again = initialized;
	initialized = 1;
	const char *v = getenv("FAKEACL_FAIL_COPY");
	fail_copy_at = v ? atol(v) : 0;
	v = getenv("FAKEACL_BATCH_UNSUPPORTED");
	batch_unsupported = v && atoi(v);
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	ndev = n > 16 ? 16 : n;
	pthread_mutex_unlock(&mu);
	if (e) return cu(e, "cudaGetDeviceCount");
	return again ? fail(E_REPEAT_INIT, "fakeacl_cuda: aclInit: already initialized") : OK;
}

aclError aclrtGetDeviceCount(uint32_t *n) { *n = (uint32_t)ndev; return OK; }

aclError aclrtSetDevice(int32_t dev) {
	if (dev < 0 || dev >= ndev) return fail(E_RT_DEVICE, "fakeacl_cuda: device %d of %d", dev, ndev);
	aclError rc = cu(cudaSetDevice(dev), "cudaSetDevice");
	if (rc) return rc;
	ctxs[dev].dev = dev;
	__atomic_add_fetch(&ctxs[dev].refs, 1, __ATOMIC_ACQ_REL);
	cur = &ctxs[dev];
	__atomic_add_fetch(&n_setdevice, 1, __ATOMIC_RELAXED);
	return OK;
}

aclError aclrtResetDevice(int32_t dev) {
	if (dev < 0 || dev >= ndev) return fail(E_RT_DEVICE, "fakeacl_cuda: device %d", dev);
	__atomic_sub_fetch(&ctxs[dev].refs, 1, __ATOMIC_ACQ_REL);
	return OK;
}

static aclError foreign_copy(const void *a, const void *b);
static long vmm_live(void);
static int vmm_range(uintptr_t p, void **base, size_t *size);

/* ---- memory table ---- */

enum { M_DEV = 1, M_IMPORT, M_HOST, M_HOSTREG };

struct meta {
	uint32_t magic, exported, no_validation, npids;
	int32_t importers;
	int32_t pids[MAX_PIDS];
	uint64_t off, size;
	cudaIpcMemHandle_t handle;
};

struct mem {
	int kind;
	uintptr_t p;
	size_t n;
	void *base;          /* M_IMPORT: what cudaIpcOpenMemHandle returned */
	int registered;      /* M_HOSTREG: cudaHostRegister'd by us */
	int metafd;          /* M_DEV exported: the key's memfd */
	struct meta *meta;
	char key[65];
	struct mem *next;
};
static struct mem *mems;

static struct mem *find(uintptr_t p, size_t n, int kind) {
	for (struct mem *m = mems; m; m = m->next) {
		if (kind && m->kind != kind) continue;
		if (p >= m->p && p - m->p < m->n && n <= m->n - (p - m->p)) return m;
	}
	return NULL;
}

static struct mem *find_key(const char *key, int kind) {
	for (struct mem *m = mems; m; m = m->next)
		if (m->kind == kind && strcmp(m->key, key) == 0) return m;
	return NULL;
}

static void add(struct mem *m) { m->next = mems; mems = m; }

static void drop(struct mem *x) {
	for (struct mem **m = &mems; *m; m = &(*m)->next)
		if (*m == x) { *m = x->next; return; }
}

static struct mem *track(int kind, void *p, size_t n) {
	struct mem *m = calloc(1, sizeof *m);
	m->kind = kind;
	m->p = (uintptr_t)p;
	m->n = n;
	m->metafd = -1;
	pthread_mutex_lock(&mu);
	add(m);
	pthread_mutex_unlock(&mu);
	return m;
}

aclError aclrtMalloc(void **p, size_t n, int policy) {
	NEED_CTX();
	if (policy < 0 || policy > 2 || n == 0) return fail(E_RT_PARAM, "fakeacl_cuda: aclrtMalloc(%zu, policy %d)", n, policy);
	aclError rc = cu(cudaMalloc(p, n), "cudaMalloc");
	if (!rc) track(M_DEV, *p, n);
	return rc;
}

aclError aclrtFree(void *p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, 0, M_DEV);
	aclError rc = OK;
	if (!m || m->p != (uintptr_t)p) rc = fail(E_RT_PARAM, "fakeacl_cuda: aclrtFree(%p): not an aclrtMalloc allocation", p);
	else if (m->key[0]) rc = fail(E_IPC, "fakeacl_cuda: aclrtFree(%p): export key %s still open", p, m->key);
	else drop(m);
	pthread_mutex_unlock(&mu);
	if (rc) return rc;
	free(m);
	return cu(cudaFree(p), "cudaFree");
}

aclError aclrtMallocHost(void **p, size_t n) {
	NEED_CTX();
	aclError rc = cu(cudaHostAlloc(p, n, cudaHostAllocPortable | cudaHostAllocMapped), "cudaHostAlloc");
	if (!rc) track(M_HOST, *p, n);
	return rc;
}

aclError aclrtFreeHost(void *p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, 0, M_HOST);
	aclError rc = OK;
	if (!m || m->p != (uintptr_t)p) rc = fail(E_RT_PARAM, "fakeacl_cuda: aclrtFreeHost(%p): not an aclrtMallocHost allocation", p);
	else if (find((uintptr_t)p, 0, M_HOSTREG)) rc = fail(E_RT_PARAM, "fakeacl_cuda: aclrtFreeHost(%p): still registered", p);
	else drop(m);
	pthread_mutex_unlock(&mu);
	if (rc) return rc;
	free(m);
	return cu(cudaFreeHost(p), "cudaFreeHost");
}

aclError aclrtHostRegister(void *p, uint64_t n, int type, void **dev) {
	NEED_CTX();
	if (type != 0 || (uintptr_t)p % PAGE) return fail(E_RT_PARAM, "fakeacl_cuda: aclrtHostRegister(%p, type %d)", p, type);
	pthread_mutex_lock(&mu);
	int pinned = find((uintptr_t)p, (size_t)n, M_HOST) != NULL;
	pthread_mutex_unlock(&mu);
	int registered = 0;
	if (!pinned) {
		aclError rc = cu(cudaHostRegister(p, (size_t)n, cudaHostRegisterPortable | cudaHostRegisterMapped), "cudaHostRegister");
		if (rc) return rc;
		registered = 1;
	}
	aclError rc = cu(cudaHostGetDevicePointer(dev, p, 0), "cudaHostGetDevicePointer");
	if (rc) {
		if (registered) cudaHostUnregister(p);
		return rc;
	}
	track(M_HOSTREG, p, (size_t)n)->registered = registered;
	return OK;
}

aclError aclrtHostUnregister(void *p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, 0, M_HOSTREG);
	if (m && m->p == (uintptr_t)p) drop(m);
	else m = NULL;
	pthread_mutex_unlock(&mu);
	if (!m) return fail(E_NOT_REGISTERED, "fakeacl_cuda: aclrtHostUnregister(%p): not registered", p);
	int reg = m->registered;
	free(m);
	return reg ? cu(cudaHostUnregister(p), "cudaHostUnregister") : OK;
}

aclError aclrtMemGetAddressRange(void *p, void **base, size_t *size) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, 0, 0);
	int found = m && m->kind != M_HOSTREG;
	if (found) {
		*base = (void *)m->p;
		*size = m->n;
	} else {
		found = vmm_range((uintptr_t)p, base, size); /* a VMM address: its mapping */
	}
	pthread_mutex_unlock(&mu);
	return found ? OK : fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemGetAddressRange(%p): unknown", p);
}

aclError aclrtMemcpy(void *dst, size_t dmax, const void *src, size_t n, int kind) {
	NEED_CTX();
	if (n > dmax || kind < 0 || kind > 3) return fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemcpy(%zu B into %zu, kind %d)", n, dmax, kind);
	aclError rc = foreign_copy(dst, src);
	if (rc) return rc;
	return cu(cudaMemcpy(dst, src, n, kind), "cudaMemcpy");
}

/* ---- streams and events ---- */

struct stream { cudaStream_t cs; aclError err; char msg[256]; };
struct event { cudaEvent_t ce; int recorded, dropped; };

static aclError new_stream(void **out) {
	struct stream *s = calloc(1, sizeof *s);
	aclError rc = cu(cudaStreamCreateWithFlags(&s->cs, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
	if (rc) { free(s); return rc; }
	__atomic_add_fetch(&n_streams, 1, __ATOMIC_RELAXED);
	*out = s;
	return OK;
}

aclError aclrtCreateStream(void **s) { NEED_CTX(); return new_stream(s); }

aclError aclrtCreateStreamWithConfig(void **s, uint32_t prio, uint32_t flags) {
	NEED_CTX();
	if (prio != 0 || (flags & ~0x3fu)) return fail(E_RT_PARAM, "fakeacl_cuda: stream priority %u flags %#x", prio, flags);
	return new_stream(s);
}

aclError aclrtDestroyStream(void *p) {
	NEED_CTX();
	struct stream *s = p;
	aclError rc = cu(cudaStreamDestroy(s->cs), "cudaStreamDestroy");
	free(s);
	__atomic_sub_fetch(&n_streams, 1, __ATOMIC_RELAXED);
	return rc;
}

aclError aclrtSynchronizeStreamWithTimeout(void *p, int32_t ms) {
	NEED_CTX();
	struct stream *s = p;
	if (!s || ms == 0 || ms < -1) return fail(E_RT_PARAM, "fakeacl_cuda: sync(%p, %d)", p, ms);
	if (ms < 0) {
		aclError rc = cu(cudaStreamSynchronize(s->cs), "cudaStreamSynchronize");
		if (rc) return rc;
	} else {
		struct timespec t0, t;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (;;) {
			cudaError_t e = cudaStreamQuery(s->cs);
			if (e == 0) break;
			if (e != cudaErrorNotReady) return cu(e, "cudaStreamQuery");
			clock_gettime(CLOCK_MONOTONIC, &t);
			if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= ms)
				return fail(E_STREAM_TIMEOUT, "fakeacl_cuda: stream still busy after %d ms", ms);
			usleep(20);
		}
	}
	return s->err ? fail(s->err, "%s", s->msg) : OK;
}

static aclError copy_async(void *dst, size_t dmax, const void *src, size_t n, int kind, struct stream *s) {
	if (!s) return fail(E_RT_PARAM, "fakeacl_cuda: async copy on the default stream is not emulated");
	if (n > dmax || kind < 0 || kind > 3) return fail(E_RT_PARAM, "fakeacl_cuda: copy of %zu B into %zu, kind %d", n, dmax, kind);
	aclError frc = foreign_copy(dst, src);
	if (frc) return frc;
	long seq = __atomic_add_fetch(&n_copies, 1, __ATOMIC_RELAXED);
	if (kind == 3) __atomic_add_fetch(&n_d2d, 1, __ATOMIC_RELAXED);
	if (s->err) return OK; /* a failed stream runs nothing more */
	if (fail_copy_at && seq == fail_copy_at) {
		s->err = E_SYS_DMA;
		snprintf(s->msg, sizeof s->msg, "fakeacl_cuda: DMA error in async copy #%ld (%zu B), injected by FAKEACL_FAIL_COPY", seq, n);
		return OK;
	}
	return cu(cudaMemcpyAsync(dst, src, n, kind, s->cs), "cudaMemcpyAsync");
}

aclError aclrtMemcpyAsync(void *dst, size_t dmax, const void *src, size_t n, int kind, void *st) {
	NEED_CTX();
	return copy_async(dst, dmax, src, n, kind, st);
}

typedef struct { uint32_t id; int32_t type; } loc_t;
typedef struct { loc_t dst, src; uint8_t rsv[16]; } attr_t;

aclError aclrtMemcpyBatchAsync(void **dsts, size_t *dmaxs, void **srcs, size_t *sizes, size_t count,
                               attr_t *attrs, size_t *idxs, size_t nattrs, size_t *failIdx, void *st) {
	NEED_CTX();
	__atomic_add_fetch(&n_batch, 1, __ATOMIC_RELAXED);
	if (failIdx) *failIdx = (size_t)-1;
	if (batch_unsupported) return fail(E_FEATURE, "fakeacl_cuda: batch copies not supported (FAKEACL_BATCH_UNSUPPORTED)");
	if (!failIdx || count == 0 || nattrs != 1 || idxs[0] != 0) return fail(E_RT_PARAM, "fakeacl_cuda: batch arrays");
	int d2h = attrs[0].src.type == 1 && attrs[0].dst.type == 0;
	int h2d = attrs[0].src.type == 0 && attrs[0].dst.type == 1;
	if (!d2h && !h2d) return fail(E_RT_PARAM, "fakeacl_cuda: batch direction");
	for (size_t i = 0; i < count; i++) {
		aclError rc = copy_async(dsts[i], dmaxs[i], srcs[i], sizes[i], d2h ? 2 : 1, st);
		if (rc) { *failIdx = i; return rc; }
	}
	return OK;
}

aclError aclrtCreateEventWithFlag(void **e, uint32_t flags) {
	NEED_CTX();
	if (flags == 0 || (flags & ~0x3bu)) return fail(E_RT_PARAM, "fakeacl_cuda: event flags %#x", flags);
	struct event *ev = calloc(1, sizeof *ev);
	aclError rc = cu(cudaEventCreateWithFlags(&ev->ce, cudaEventDisableTiming), "cudaEventCreateWithFlags");
	if (rc) { free(ev); return rc; }
	__atomic_add_fetch(&n_events, 1, __ATOMIC_RELAXED);
	*e = ev;
	return OK;
}

aclError aclrtDestroyEvent(void *e) {
	NEED_CTX();
	struct event *ev = e;
	aclError rc = cu(cudaEventDestroy(ev->ce), "cudaEventDestroy");
	free(ev);
	__atomic_sub_fetch(&n_events, 1, __ATOMIC_RELAXED);
	return rc;
}

aclError aclrtRecordEvent(void *e, void *st) {
	NEED_CTX();
	struct event *ev = e;
	struct stream *s = st;
	if (!ev || !s) return fail(E_RT_PARAM, "fakeacl_cuda: aclrtRecordEvent(%p, %p)", e, st);
	ev->recorded = 1;
	ev->dropped = s->err != 0;
	if (ev->dropped) return OK;
	return cu(cudaEventRecord(ev->ce, s->cs), "cudaEventRecord");
}

static aclError status(struct event *ev, int *complete) {
	*complete = 0;
	if (!ev->recorded || ev->dropped) return OK;
	cudaError_t e = cudaEventQuery(ev->ce);
	if (e == cudaErrorNotReady) return OK;
	if (e) return cu(e, "cudaEventQuery");
	*complete = 1;
	return OK;
}

aclError aclrtQueryEventStatus(void *e, int32_t *st) {
	NEED_CTX();
	int c;
	aclError rc = status(e, &c);
	*st = c ? 1 : 0; /* ACL_EVENT_RECORDED_STATUS_COMPLETE 1, NOT_READY 0 */
	return rc;
}

aclError aclrtQueryEvent(void *e, int32_t *st) {
	NEED_CTX();
	__atomic_add_fetch(&n_legacy_query, 1, __ATOMIC_RELAXED);
	int c;
	aclError rc = status(e, &c);
	*st = c ? 0 : 1; /* legacy aclrtEventStatus: COMPLETE 0, NOT_READY 1 */
	return rc;
}

/* ---- IPC ---- */

aclError aclrtIpcMemGetExportKey(void *p, size_t n, char *key, size_t len, uint64_t flags) {
	NEED_CTX();
	if (len != 65 || flags > 1) return fail(E_RT_PARAM, "fakeacl_cuda: export key buffer %zu, flags %llu", len, (unsigned long long)flags);
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, n, M_DEV);
	aclError rc = OK;
	if (!m) rc = fail(E_RT_PARAM, "fakeacl_cuda: export of %p+%zu: not inside one aclrtMalloc allocation", p, n);
	else if (m->key[0]) rc = fail(E_RT_PARAM, "fakeacl_cuda: %p already exported", p);
	pthread_mutex_unlock(&mu);
	if (rc) return rc;
	cudaIpcMemHandle_t h;
	if ((rc = cu(cudaIpcGetMemHandle(&h, (void *)m->p), "cudaIpcGetMemHandle"))) return rc;
	int fd = memfd_create("fakeacl-cuda-key", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, PAGE) != 0) {
		if (fd >= 0) close(fd);
		return fail(E_IPC, "fakeacl_cuda: memfd: %s", strerror(errno));
	}
	struct meta *meta = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (meta == MAP_FAILED) {
		close(fd);
		return fail(E_IPC, "fakeacl_cuda: mmap: %s", strerror(errno));
	}
	meta->magic = MAGIC;
	meta->no_validation = (uint32_t)flags;
	meta->off = (uintptr_t)p - m->p;
	meta->size = n;
	meta->handle = h;
	__atomic_store_n(&meta->exported, 1, __ATOMIC_RELEASE);
	pthread_mutex_lock(&mu);
	m->metafd = fd;
	m->meta = meta;
	snprintf(m->key, sizeof m->key, "fakeaclcu:%d:%d", (int)getpid(), fd);
	memcpy(key, m->key, 65);
	pthread_mutex_unlock(&mu);
	return OK;
}

aclError aclrtIpcMemSetImportPid(const char *key, int32_t *pids, size_t n) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = find_key(key, M_DEV);
	aclError rc = OK;
	if (!m) rc = fail(E_RT_PARAM, "fakeacl_cuda: %s: not a key this process exported", key);
	else rc = add_pids(m->meta->pids, &m->meta->npids, pids, n);
	pthread_mutex_unlock(&mu);
	return rc;
}

aclError aclrtIpcMemImportByKey(void **p, const char *key, uint64_t flags) {
	NEED_CTX();
	int pid, fd;
	if (flags > 1 || !key || sscanf(key, "fakeaclcu:%d:%d", &pid, &fd) != 2) return fail(E_RT_PARAM, "fakeacl_cuda: %s is not a key", key ? key : "(null)");
	pthread_mutex_lock(&mu);
	struct mem *dup = find_key(key, M_IMPORT);
	pthread_mutex_unlock(&mu);
	if (dup) return fail(E_RT_PARAM, "fakeacl_cuda: %s already imported here", key);
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
	int f = open(path, O_RDWR | O_CLOEXEC);
	if (f < 0) return fail(E_IPC, "fakeacl_cuda: %s: open %s: %s", key, path, strerror(errno));
	struct meta *meta = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
	close(f);
	if (meta == MAP_FAILED || meta->magic != MAGIC || !__atomic_load_n(&meta->exported, __ATOMIC_ACQUIRE)) {
		if (meta != MAP_FAILED) munmap(meta, PAGE);
		return fail(E_IPC, "fakeacl_cuda: %s is not exported", key);
	}
	if (!meta->no_validation) {
		if (!pid_listed(meta->pids, meta->npids, bare_tgid())) {
			munmap(meta, PAGE);
			return fail(E_NO_PERMISSION, "fakeacl_cuda: BareTgid %d is not on the import whitelist of %s", (int)bare_tgid(), key);
		}
	}
	void *base = NULL;
	aclError rc = cu(cudaIpcOpenMemHandle(&base, meta->handle, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
	if (rc) {
		munmap(meta, PAGE);
		return rc;
	}
	__atomic_add_fetch(&meta->importers, 1, __ATOMIC_ACQ_REL);
	struct mem *m = track(M_IMPORT, (char *)base + meta->off, meta->size);
	pthread_mutex_lock(&mu);
	m->base = base;
	m->meta = meta;
	snprintf(m->key, sizeof m->key, "%s", key);
	pthread_mutex_unlock(&mu);
	*p = (char *)base + meta->off;
	return OK;
}

aclError aclrtIpcMemClose(const char *key) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = find_key(key, M_IMPORT);
	if (m) {
		drop(m);
		pthread_mutex_unlock(&mu);
		aclError rc = cu(cudaIpcCloseMemHandle(m->base), "cudaIpcCloseMemHandle");
		__atomic_sub_fetch(&m->meta->importers, 1, __ATOMIC_ACQ_REL);
		munmap(m->meta, PAGE);
		free(m);
		return rc;
	}
	m = find_key(key, M_DEV);
	aclError rc = OK;
	if (!m) rc = fail(E_RT_PARAM, "fakeacl_cuda: aclrtIpcMemClose(%s): unknown key", key);
	else if (__atomic_load_n(&m->meta->importers, __ATOMIC_ACQUIRE) > 0)
		rc = fail(E_IPC, "fakeacl_cuda: aclrtIpcMemClose(%s): still imported by %d process(es)", key, m->meta->importers);
	else {
		__atomic_store_n(&m->meta->exported, 0, __ATOMIC_RELEASE);
		munmap(m->meta, PAGE);
		close(m->metafd);
		m->meta = NULL;
		m->metafd = -1;
		m->key[0] = 0;
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

/* ---- virtual memory over CUDA's VMM driver API ----
 *
 * Physical chunks are cuMemCreate allocations (requested handle type POSIX
 * fd), reservations cuMemAddressReserve, mappings cuMemMap + cuMemSetAccess.
 * A shareable handle is (exporter pid << 32 | sequence); the exporter keeps
 * the chunk's POSIX fd (cuMemExportToShareableHandle) with its whitelist
 * and hands the fd over SCM_RIGHTS, on an abstract unix socket named after
 * its pid, to an importer whose BareTgid is on the list (or to any, without
 * pid validation). The importer turns it into its handle with
 * cuMemImportFromShareableHandle. A chunk imported on another device than
 * its own is marked: copies through its mappings are refused, as CANN
 * refuses H2D/D2H on memory imported from another device. */

#ifndef FAKEACL_NO_VMM
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
	int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED 1 */
	int requestedHandleTypes; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1 */
	CUmemLocation location;   /* CU_MEM_LOCATION_TYPE_DEVICE 1 */
	void *win32HandleMetaData;
	struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc; /* flags: NONE 0, READ 1, READWRITE 3 */
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
CUresult cuMemExportToShareableHandle(void *, CUmemGenericAllocationHandle, int, unsigned long long);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *, void *, int);
CUresult cuMemGetAllocationGranularity(size_t *, const CUmemAllocationProp *, int);
CUresult cuGetErrorString(CUresult, const char **);
#define CU_POSIX_FD 1

/* cd maps a CUDA driver error onto an aclError with the driver's text. */
static aclError cd(CUresult e, const char *what) {
	if (e == 0) return OK;
	const char *s = NULL;
	cuGetErrorString(e, &s);
	return fail(e == 2 ? E_MEM_ALLOC : E_DRV, "fakeacl_cuda: %s: CUDA driver error %d: %s", what, e, s ? s : "?");
}

/* One physical chunk (M_PHYS: ours; M_PIMPORT: imported), a reservation
 * (M_RESERVE) or a mapping (M_MAPPED), kept in their own list. */
enum { V_PHYS = 1, V_PIMPORT, V_RESERVE, V_MAPPED };
struct vmem {
	int kind;
	uintptr_t p;  /* V_RESERVE, V_MAPPED: the range */
	size_t n;
	CUmemGenericAllocationHandle h;
	int dev;      /* V_PHYS/V_PIMPORT: the chunk's device; V_MAPPED: the importer's device */
	int foreign;  /* V_PIMPORT, V_MAPPED: imported on another device than the chunk's */
	long refs, maps;
	uint64_t shareable;
	int fd;       /* V_PHYS exported: the POSIX fd */
	int no_validation;
	uint32_t npids;
	int32_t pids[MAX_PIDS];
	struct vmem *phys;
	struct vmem *next;
};
static struct vmem *vmems;
static long n_vmm_maps, n_foreign, export_seq;
static int srv_fd = -1;
static pthread_t srv_th;

static void vadd(struct vmem *v) { v->next = vmems; vmems = v; }
static void vdrop(struct vmem *x) {
	for (struct vmem **v = &vmems; *v; v = &(*v)->next)
		if (*v == x) { *v = x->next; return; }
}
static struct vmem *vfind(int kind, uintptr_t p) {
	for (struct vmem *v = vmems; v; v = v->next)
		if (v->kind == kind && v->p == p) return v;
	return NULL;
}
static struct vmem *vphys(void *h) {
	for (struct vmem *v = vmems; v; v = v->next)
		if (v == h && (v->kind == V_PHYS || v->kind == V_PIMPORT)) return v;
	return NULL;
}
/* vmapped returns the mapping holding p (mu held). */
static struct vmem *vmapped(uintptr_t p) {
	for (struct vmem *v = vmems; v; v = v->next)
		if (v->kind == V_MAPPED && p >= v->p && p - v->p < v->n) return v;
	return NULL;
}

/* foreign_copy refuses a copy touching memory imported from another device. */
static aclError foreign_copy(const void *a, const void *b) {
	if (!__atomic_load_n(&n_foreign, __ATOMIC_ACQUIRE)) return OK;
	pthread_mutex_lock(&mu);
	struct vmem *v = vmapped((uintptr_t)a);
	if (!v || !v->foreign) v = vmapped((uintptr_t)b);
	int bad = v && v->foreign, mine = v ? v->dev : 0, theirs = v ? v->phys->dev : 0;
	pthread_mutex_unlock(&mu);
	if (bad) return fail(E_RT_PARAM, "fakeacl_cuda: copy with memory of device %d imported on device %d: memory imported from another device cannot be the source or target of H2D/D2H copies", theirs, mine);
	return OK;
}

static void vprop(CUmemAllocationProp *p, int dev) {
	memset(p, 0, sizeof *p);
	p->type = 1;
	p->requestedHandleTypes = CU_POSIX_FD;
	p->location.type = 1;
	p->location.id = dev;
}

aclError aclrtMemGetAllocationGranularity(physprop_t *prop, int option, size_t *g) {
	NEED_CTX();
	if (!prop || !g || (option != 0 && option != 1)) return fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemGetAllocationGranularity: bad arguments");
	CUmemAllocationProp p;
	vprop(&p, cur->dev);
	return cd(cuMemGetAllocationGranularity(g, &p, option), "cuMemGetAllocationGranularity");
}

aclError aclrtMallocPhysical(void **handle, size_t size, const physprop_t *prop, uint64_t flags) {
	NEED_CTX();
	if (!handle || !prop || flags || prop->loc_type != 1 || prop->loc_id >= (uint32_t)ndev || prop->allocationType != 0)
		return fail(E_RT_PARAM, "fakeacl_cuda: aclrtMallocPhysical: bad arguments (want a device location, PINNED, flags 0)");
	CUmemAllocationProp p;
	vprop(&p, (int)prop->loc_id);
	CUmemGenericAllocationHandle h;
	aclError rc = cd(cuMemCreate(&h, size, &p, 0), "cuMemCreate");
	if (rc) return rc;
	struct vmem *v = calloc(1, sizeof *v);
	v->kind = V_PHYS;
	v->n = size;
	v->h = h;
	v->dev = (int)prop->loc_id;
	v->refs = 1;
	v->fd = -1;
	pthread_mutex_lock(&mu);
	vadd(v);
	pthread_mutex_unlock(&mu);
	*handle = v;
	return OK;
}

/* vput drops one owner of chunk v (mu held); the last with no mapping releases it. */
static aclError vput(struct vmem *v) {
	if (--v->refs > 0 || v->maps > 0) return OK;
	vdrop(v);
	aclError rc = cd(cuMemRelease(v->h), "cuMemRelease");
	if (v->fd >= 0) close(v->fd);
	free(v);
	return rc;
}

aclError aclrtFreePhysical(void *handle) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct vmem *v = vphys(handle);
	aclError rc = !v || v->refs <= 0 ? fail(E_RT_PARAM, "fakeacl_cuda: aclrtFreePhysical(%p): not a live physical handle", handle) : vput(v);
	pthread_mutex_unlock(&mu);
	return rc;
}

aclError aclrtMemGetAllocationPropertiesFromHandle(void *handle, physprop_t *prop) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct vmem *v = vphys(handle);
	if (v && prop) {
		memset(prop, 0, sizeof *prop);
		prop->memAttr = 4;
		prop->loc_type = 1;
		prop->loc_id = (uint32_t)v->dev;
	}
	pthread_mutex_unlock(&mu);
	return v && prop ? OK : fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemGetAllocationPropertiesFromHandle(%p): not a physical handle", handle);
}

aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags) {
	NEED_CTX();
	if (!virPtr || !size || alignment || expectPtr || flags > 1) return fail(E_RT_PARAM, "fakeacl_cuda: aclrtReserveMemAddress: bad arguments (alignment 0, expectPtr NULL)");
	CUdeviceptr p;
	aclError rc = cd(cuMemAddressReserve(&p, size, 0, 0, 0), "cuMemAddressReserve");
	if (rc) return rc;
	struct vmem *v = calloc(1, sizeof *v);
	v->kind = V_RESERVE;
	v->p = (uintptr_t)p;
	v->n = size;
	pthread_mutex_lock(&mu);
	vadd(v);
	pthread_mutex_unlock(&mu);
	*virPtr = (void *)(uintptr_t)p;
	return OK;
}

aclError aclrtReleaseMemAddress(void *virPtr) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct vmem *r = vfind(V_RESERVE, (uintptr_t)virPtr);
	aclError rc = r ? OK : fail(E_RT_PARAM, "fakeacl_cuda: aclrtReleaseMemAddress(%p): not a reservation", virPtr);
	for (struct vmem *v = vmems; v && !rc; v = v->next)
		if (v->kind == V_MAPPED && v->p >= r->p && v->p - r->p < r->n) rc = fail(E_RT_PARAM, "fakeacl_cuda: aclrtReleaseMemAddress(%p): still mapped", virPtr);
	if (!rc) vdrop(r);
	pthread_mutex_unlock(&mu);
	if (rc) return rc;
	rc = cd(cuMemAddressFree((CUdeviceptr)r->p, r->n), "cuMemAddressFree");
	free(r);
	return rc;
}

static aclError vaccess(uintptr_t p, size_t n, int dev, int flags) {
	CUmemAccessDesc d = {{1, dev}, flags};
	return cd(cuMemSetAccess((CUdeviceptr)p, n, &d, 1), "cuMemSetAccess");
}

aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, void *handle, uint64_t flags) {
	NEED_CTX();
	if (offset || flags) return fail(E_RT_PARAM, "fakeacl_cuda: aclrtMapMem: offset and flags are reserved, must be 0");
	pthread_mutex_lock(&mu);
	struct vmem *ph = vphys(handle);
	aclError rc = OK;
	if (!ph) rc = fail(E_RT_PARAM, "fakeacl_cuda: aclrtMapMem(%p): not a physical handle", virPtr);
	else if (size != ph->n) rc = fail(E_RT_PARAM, "fakeacl_cuda: aclrtMapMem(%p, %zu B): the size must equal the physical allocation's (%zu B)", virPtr, size, ph->n);
	if (!rc) rc = cd(cuMemMap((CUdeviceptr)(uintptr_t)virPtr, size, 0, ph->h, 0), "cuMemMap");
	/* Local chunks are usable at once (as in fakeacl.c); imported ones after aclrtMemSetAccess. */
	if (!rc && ph->kind == V_PHYS && (rc = vaccess((uintptr_t)virPtr, size, cur->dev, 3)))
		cuMemUnmap((CUdeviceptr)(uintptr_t)virPtr, size);
	if (!rc) {
		struct vmem *v = calloc(1, sizeof *v);
		v->kind = V_MAPPED;
		v->p = (uintptr_t)virPtr;
		v->n = size;
		v->phys = ph;
		v->dev = cur->dev;
		v->foreign = ph->foreign;
		if (v->foreign) __atomic_add_fetch(&n_foreign, 1, __ATOMIC_ACQ_REL);
		ph->maps++;
		vadd(v);
		__atomic_add_fetch(&n_vmm_maps, 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

aclError aclrtUnmapMem(void *virPtr) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct vmem *v = vfind(V_MAPPED, (uintptr_t)virPtr);
	aclError rc = v ? OK : fail(E_RT_PARAM, "fakeacl_cuda: aclrtUnmapMem(%p): not a mapping's start", virPtr);
	if (!rc) {
		vdrop(v);
		rc = cd(cuMemUnmap((CUdeviceptr)v->p, v->n), "cuMemUnmap");
		if (v->foreign) __atomic_sub_fetch(&n_foreign, 1, __ATOMIC_ACQ_REL);
		v->phys->maps--;
		v->phys->refs++;
		aclError r2 = vput(v->phys);
		if (!rc) rc = r2;
		free(v);
		__atomic_sub_fetch(&n_vmm_maps, 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

aclError aclrtMemSetAccess(void *virPtr, size_t size, accessdesc_t *desc, size_t count) {
	NEED_CTX();
	if (!desc || !count) return fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemSetAccess: no descriptor");
	pthread_mutex_lock(&mu);
	struct vmem *v = vfind(V_MAPPED, (uintptr_t)virPtr);
	pthread_mutex_unlock(&mu);
	if (!v || v->n != size) return fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemSetAccess(%p, %zu B): want one aclrtMapMem's address and size", virPtr, size);
	for (size_t i = 0; i < count; i++) {
		if ((desc[i].flags != 0 && desc[i].flags != 1 && desc[i].flags != 3) || desc[i].loc_type != 1 || desc[i].loc_id >= (uint32_t)ndev)
			return fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemSetAccess: desc %zu: flags %d, location {%u, %d}", i, desc[i].flags, desc[i].loc_id, desc[i].loc_type);
		aclError rc = vaccess((uintptr_t)virPtr, size, (int)desc[i].loc_id, desc[i].flags);
		if (rc) return rc;
	}
	return OK;
}

aclError aclrtMemRetainAllocationHandle(void *virPtr, void **handle) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct vmem *v = vfind(V_MAPPED, (uintptr_t)virPtr);
	if (v && handle) {
		v->phys->refs++;
		*handle = v->phys;
	}
	pthread_mutex_unlock(&mu);
	return v && handle ? OK : fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemRetainAllocationHandle(%p): not the start of a mapping", virPtr);
}

/* The exporter's fd server: a request is {u64 shareable, i32 BareTgid};
 * the answer {i32 status, i32 device, u64 size}, with the chunk's fd when
 * status is 0. */
struct vreq { uint64_t shareable; int32_t tgid; int32_t pad; };
struct vans { int32_t status, dev; uint64_t size; };

static void srv_path(struct sockaddr_un *a, socklen_t *len, int pid) {
	memset(a, 0, sizeof *a);
	a->sun_family = AF_UNIX;
	int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "fakeaclcu-vmm-%d", pid);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static void *serve(void *arg) {
	(void)arg;
	for (;;) {
		int c = accept4(srv_fd, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED) continue;
			return NULL;
		}
		struct vreq q;
		struct vans a = {E_IPC, 0, 0};
		int fd = -1;
		if (read(c, &q, sizeof q) == (ssize_t)sizeof q) {
			pthread_mutex_lock(&mu);
			struct vmem *v = NULL;
			for (struct vmem *x = vmems; x; x = x->next)
				if (x->kind == V_PHYS && x->fd >= 0 && x->shareable == q.shareable) v = x;
			if (v) {
				int ok = v->no_validation || pid_listed(v->pids, v->npids, q.tgid);
				a.status = ok ? OK : E_NO_PERMISSION;
				a.dev = v->dev;
				a.size = v->n;
				if (ok) fd = dup(v->fd);
			}
			pthread_mutex_unlock(&mu);
		}
		char cbuf[CMSG_SPACE(sizeof(int))];
		struct iovec io = {&a, sizeof a};
		struct msghdr m = {0};
		m.msg_iov = &io;
		m.msg_iovlen = 1;
		if (fd >= 0) {
			memset(cbuf, 0, sizeof cbuf);
			m.msg_control = cbuf;
			m.msg_controllen = sizeof cbuf;
			struct cmsghdr *h = CMSG_FIRSTHDR(&m);
			h->cmsg_level = SOL_SOCKET;
			h->cmsg_type = SCM_RIGHTS;
			h->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(h), &fd, sizeof fd);
		}
		if (sendmsg(c, &m, MSG_NOSIGNAL) < 0) { /* the importer left */ }
		if (fd >= 0) close(fd);
		close(c);
	}
}

/* start_server listens once per process (mu held). */
static aclError start_server(void) {
	if (srv_fd >= 0) return OK;
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct sockaddr_un a;
	socklen_t len;
	srv_path(&a, &len, getpid());
	if (s < 0 || bind(s, (struct sockaddr *)&a, len) != 0 || listen(s, 64) != 0) {
		if (s >= 0) close(s);
		return fail(E_IPC, "fakeacl_cuda: the export server's socket: %s", strerror(errno));
	}
	srv_fd = s;
	if (pthread_create(&srv_th, NULL, serve, NULL) != 0) {
		close(s);
		srv_fd = -1;
		return fail(E_IPC, "fakeacl_cuda: no thread for the export server");
	}
	pthread_detach(srv_th);
	return OK;
}

aclError aclrtMemExportToShareableHandle(void *handle, int handleType, uint64_t flags, uint64_t *shareable) {
	NEED_CTX();
	if (!shareable || handleType != 0 || flags > 1) return fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemExportToShareableHandle: handleType must be NONE (0), flags 0 or 1");
	pthread_mutex_lock(&mu);
	struct vmem *v = vphys(handle);
	aclError rc = OK;
	if (!v || v->kind != V_PHYS) rc = fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemExportToShareableHandle(%p): not a physical handle of this process", handle);
	else if (v->fd >= 0) rc = fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemExportToShareableHandle(%p): already exported (one shareable handle per handle)", handle);
	if (!rc) rc = start_server();
	int fd = -1;
	if (!rc) rc = cd(cuMemExportToShareableHandle(&fd, v->h, CU_POSIX_FD, 0), "cuMemExportToShareableHandle(POSIX fd)");
	if (!rc) {
		v->fd = fd;
		v->no_validation = (int)flags;
		v->npids = 0;
		v->shareable = ((uint64_t)(uint32_t)getpid() << 32) | (uint64_t)(++export_seq);
		*shareable = v->shareable;
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

aclError aclrtMemSetPidToShareableHandle(uint64_t shareable, int32_t *pids, size_t n) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct vmem *v = NULL;
	for (struct vmem *x = vmems; x; x = x->next)
		if (x->kind == V_PHYS && x->fd >= 0 && x->shareable == shareable) v = x;
	aclError rc = OK;
	if (!v || !pids) rc = fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemSetPidToShareableHandle(%#llx): not exported here", (unsigned long long)shareable);
	else rc = add_pids(v->pids, &v->npids, pids, n);
	pthread_mutex_unlock(&mu);
	return rc;
}

aclError aclrtMemImportFromShareableHandle(uint64_t shareable, int32_t deviceId, void **handle) {
	NEED_CTX();
	int pid = (int)(shareable >> 32);
	if (!handle || deviceId < 0 || deviceId >= ndev) return fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemImportFromShareableHandle: bad arguments");
	if (pid == getpid()) return fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemImportFromShareableHandle(%#llx): exported by this process", (unsigned long long)shareable);
	pthread_mutex_lock(&mu);
	for (struct vmem *x = vmems; x; x = x->next)
		if (x->kind == V_PIMPORT && x->shareable == shareable) {
			pthread_mutex_unlock(&mu);
			return fail(E_RT_PARAM, "fakeacl_cuda: aclrtMemImportFromShareableHandle(%#llx): already imported here", (unsigned long long)shareable);
		}
	pthread_mutex_unlock(&mu);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct sockaddr_un a;
	socklen_t len;
	srv_path(&a, &len, pid);
	if (s < 0 || connect(s, (struct sockaddr *)&a, len) != 0) {
		if (s >= 0) close(s);
		return fail(E_IPC, "fakeacl_cuda: aclrtMemImportFromShareableHandle(%#llx): no exporter %d: %s", (unsigned long long)shareable, pid, strerror(errno));
	}
	struct vreq q = {shareable, bare_tgid(), 0};
	struct vans ans = {E_IPC, 0, 0};
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec io = {&ans, sizeof ans};
	struct msghdr m = {0};
	m.msg_iov = &io;
	m.msg_iovlen = 1;
	m.msg_control = cbuf;
	m.msg_controllen = sizeof cbuf;
	int fd = -1;
	if (write(s, &q, sizeof q) == (ssize_t)sizeof q && recvmsg(s, &m, MSG_CMSG_CLOEXEC) == (ssize_t)sizeof ans) {
		struct cmsghdr *h = CMSG_FIRSTHDR(&m);
		if (h && h->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(h), sizeof fd);
	}
	close(s);
	if (ans.status != OK || fd < 0) {
		if (fd >= 0) close(fd);
		if (ans.status == E_NO_PERMISSION)
			return fail(E_NO_PERMISSION, "fakeacl_cuda: aclrtMemImportFromShareableHandle(%#llx): BareTgid %d is not on the whitelist", (unsigned long long)shareable, (int)bare_tgid());
		return fail(E_IPC, "fakeacl_cuda: aclrtMemImportFromShareableHandle(%#llx): not exported (freed?)", (unsigned long long)shareable);
	}
	CUmemGenericAllocationHandle h;
	aclError rc = cd(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_POSIX_FD), "cuMemImportFromShareableHandle(POSIX fd)");
	close(fd);
	if (rc) return rc;
	struct vmem *v = calloc(1, sizeof *v);
	v->kind = V_PIMPORT;
	v->n = ans.size;
	v->h = h;
	v->dev = ans.dev;
	v->foreign = ans.dev != deviceId;
	v->refs = 1;
	v->fd = -1;
	v->shareable = shareable;
	pthread_mutex_lock(&mu);
	vadd(v);
	pthread_mutex_unlock(&mu);
	*handle = v;
	return OK;
}

aclError aclrtGetPhyDevIdByLogicDevId(const int32_t logic, int32_t *const phys) {
	if (logic < 0 || logic >= ndev || !phys) return fail(E_RT_DEVICE, "fakeacl_cuda: aclrtGetPhyDevIdByLogicDevId(%d)", logic);
	*phys = logic; /* CUDA_VISIBLE_DEVICES is CUDA's business: ordinals as CUDA numbers them */
	return OK;
}

long fakeacl_vmm_maps(void) { return n_vmm_maps; }

static long vmm_live(void) {
	long n = 0;
	for (struct vmem *v = vmems; v; v = v->next) n++;
	return n;
}

static int vmm_range(uintptr_t p, void **base, size_t *size) {
	struct vmem *v = vmapped(p);
	if (!v) return 0;
	*base = (void *)v->p;
	*size = v->n;
	return 1;
}
#else
static aclError foreign_copy(const void *a, const void *b) { (void)a; (void)b; return OK; }
static long vmm_live(void) { return 0; }
static int vmm_range(uintptr_t p, void **base, size_t *size) { (void)p; (void)base; (void)size; return 0; }
#endif /* FAKEACL_NO_VMM */

/* ---- test hooks (as fakeacl.c, where they make sense) ---- */

long fakeacl_live(void) {
	pthread_mutex_lock(&mu);
	long n = 0;
	for (struct mem *m = mems; m; m = m->next) n++;
	for (int i = 0; i < 16; i++) n += ctxs[i].refs;
	n += vmm_live();
	pthread_mutex_unlock(&mu);
	return n + __atomic_load_n(&n_streams, __ATOMIC_RELAXED) + __atomic_load_n(&n_events, __ATOMIC_RELAXED);
}
long fakeacl_setdevice_calls(void) { return n_setdevice; }
long fakeacl_ctx_sets(void) { return n_ctx_sets; }
long fakeacl_copies(void) { return n_copies; }
long fakeacl_d2d_copies(void) { return n_d2d; }
long fakeacl_batch_calls(void) { return n_batch; }
long fakeacl_legacy_queries(void) { return n_legacy_query; }
