/* fakehip.c: an emulation of the slice of libamdhip64.so that stage binds,
 * over host memory, for the CPU tests (built with gcc into a .so). It has
 * never been compared with a real GPU; it models what the HIP documentation
 * says, and is stricter where that catches stage's mistakes.
 *
 * What it models:
 *   - a current device per OS thread (0 until hipSetDevice); allocations,
 *     streams and events belong to the current device of the calling thread;
 *   - "device memory" is carved out of one memfd per process (the heap,
 *     mapped once), so that another process can map it: an IPC handle names
 *     the heap as /proc/<pid>/fd/<fd> plus the offset of the allocation's
 *     metadata page. hipIpcGetMemHandle of an interior pointer returns the
 *     handle of the whole allocation and hipIpcOpenMemHandle maps the
 *     allocation BASE, so an importer that drops the sub-range offset reads
 *     the wrong bytes. Opening one handle twice in a process fails (208);
 *     hipIpcCloseMemHandle wants the pointer open returned;
 *   - hipHostMalloc'd pinned memory whose device view
 *     (hipHostGetDevicePointer) is an address the host cannot use (bit 62
 *     set): passing it to a copy as the host side is refused;
 *   - each stream runs its tasks in order on a worker thread; an event
 *     completes when the worker reaches it; hipEventQuery returns 600 while
 *     pending; an injected copy failure makes the stream's later copies
 *     no-ops and its later events, its synchronize, fail with that code;
 *   - async copies with pageable host memory run synchronously (counted).
 * Stricter than the runtime: hipFree of an allocation still open in an
 * importer fails, so tests see importers that forget to close.
 *
 * Environment (read at the first call):
 *   FAKEHIP_DEVICES=N           number of devices (default 1, at most 8)
 *   FAKEHIP_INIT_ERR=N          hipInit returns N
 *   FAKEHIP_FAIL_COPY=N         the Nth async copy enqueued fails (700) when it runs
 *   FAKEHIP_HOST_LIMIT=N        hipHostMalloc of more than N bytes fails (2)
 *   FAKEHIP_NO_DEVICE_POINTER=1 hipHostGetDevicePointer fails (1)
 * Build flag: -DFAKEHIP_NO_PEER leaves out hipDeviceEnablePeerAccess.
 * Test hooks (long f(void) or long f(long)): see the end of the file. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int hipError_t;
enum {
	OK = 0, E_VALUE = 1, E_OOM = 2, E_DEVPTR = 17, E_DEVICE = 101, E_MAPPED = 208,
	E_HANDLE = 400, E_NOT_READY = 600, E_ILLEGAL = 700, E_PEER_ON = 704,
};
enum { H2D = 1, D2H = 2, D2D = 3 };

#define PAGE 4096UL
#define VIEW_BIT (1ULL << 62)
#define MAGIC 0x50494846u /* "FHIP" */
#define HEAP_SIZE (64UL << 30)

static const struct { hipError_t code; const char *name, *text; } errtab[] = {
	{ OK, "hipSuccess", "no error" },
	{ E_VALUE, "hipErrorInvalidValue", "invalid argument" },
	{ E_OOM, "hipErrorOutOfMemory", "out of memory" },
	{ E_DEVPTR, "hipErrorInvalidDevicePointer", "invalid device pointer" },
	{ E_DEVICE, "hipErrorInvalidDevice", "invalid device ordinal" },
	{ E_MAPPED, "hipErrorAlreadyMapped", "resource already mapped" },
	{ E_HANDLE, "hipErrorInvalidHandle", "invalid resource handle" },
	{ E_NOT_READY, "hipErrorNotReady", "device not ready" },
	{ E_ILLEGAL, "hipErrorIllegalAddress", "an illegal memory access was encountered" },
	{ E_PEER_ON, "hipErrorPeerAccessAlreadyEnabled", "peer access is already enabled" },
};

static int errix(hipError_t e) {
	for (int i = 0; i < (int)(sizeof errtab / sizeof errtab[0]); i++)
		if (errtab[i].code == e) return i;
	return -1;
}

const char *hipGetErrorName(hipError_t e) { int i = errix(e); return i < 0 ? "hipErrorUnknown" : errtab[i].name; }
const char *hipGetErrorString(hipError_t e) { int i = errix(e); return i < 0 ? "unknown error" : errtab[i].text; }

/* ---- setup, devices ---- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int ndev = 1, init_err, no_devptr, heap_fd = -1;
static long fail_copy_at, host_limit;
static char *heap;
static size_t heap_top;
static long n_init, n_copies, n_sync_copies, n_opens, n_closes, n_interior, n_streams, n_events;
static long last_stream_flags = -1, last_event_flags = -1, last_host_flags = -1, last_ipc_flags = -1;
static __thread int cur;

static long envl(const char *k, long def) {
	const char *v = getenv(k);
	return v && *v ? atol(v) : def;
}

static void setup(void) {
	ndev = (int)envl("FAKEHIP_DEVICES", 1);
	if (ndev < 1 || ndev > 8) ndev = 1;
	init_err = (int)envl("FAKEHIP_INIT_ERR", 0);
	fail_copy_at = envl("FAKEHIP_FAIL_COPY", 0);
	host_limit = envl("FAKEHIP_HOST_LIMIT", 0);
	no_devptr = (int)envl("FAKEHIP_NO_DEVICE_POINTER", 0);
	int fd = memfd_create("fakehip-device-heap", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)HEAP_SIZE) != 0) return;
	void *h = mmap(NULL, HEAP_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	if (h == MAP_FAILED) { close(fd); return; }
	heap_fd = fd;
	heap = h;
}
#define SETUP() pthread_once(&once, setup)

hipError_t hipInit(unsigned int flags) {
	SETUP();
	__atomic_add_fetch(&n_init, 1, __ATOMIC_RELAXED);
	if (init_err) return init_err;
	return flags ? E_VALUE : OK;
}

hipError_t hipGetDeviceCount(int *n) { SETUP(); if (!n) return E_VALUE; *n = ndev; return OK; }
hipError_t hipGetDevice(int *d) { SETUP(); if (!d) return E_VALUE; *d = cur; return OK; }
hipError_t hipSetDevice(int d) { SETUP(); if (d < 0 || d >= ndev) return E_DEVICE; cur = d; return OK; }

#ifndef FAKEHIP_NO_PEER
static unsigned char peer_on[8][8];

hipError_t hipDeviceEnablePeerAccess(int peer, unsigned int flags) {
	SETUP();
	if (flags) return E_VALUE;
	if (peer < 0 || peer >= ndev || peer == cur) return E_DEVICE;
	pthread_mutex_lock(&mu);
	hipError_t rc = peer_on[cur][peer] ? E_PEER_ON : OK;
	peer_on[cur][peer] = 1;
	pthread_mutex_unlock(&mu);
	return rc;
}
#endif

/* ---- memory table ---- */

enum { M_DEV = 1, M_IMPORT, M_HOST };

/* First page of every device allocation, shared by exporter and importers. */
struct meta { uint32_t magic, exported; int32_t importers; uint32_t pad; uint64_t size, gen; };

/* The 64 bytes of a handle. */
struct handle { uint32_t magic; int32_t pid, fd; uint32_t pad; uint64_t metaoff, size, gen; char zero[24]; };
_Static_assert(sizeof(struct handle) == 64, "a HIP IPC handle is 64 bytes");

struct mem {
	int kind, dev;
	uintptr_t p;
	size_t n, maplen;
	unsigned flags;    /* M_HOST: hipHostMalloc flags */
	struct meta *meta; /* M_DEV, M_IMPORT */
	struct handle h;   /* M_IMPORT: the handle it was opened from */
	struct mem *next;
};
static struct mem *mems;
static uint64_t next_gen = 1;

static size_t up(size_t n) { return (n + PAGE - 1) / PAGE * PAGE; }

/* find returns the entry of kind (0: any) whose range holds [p, p+n). */
static struct mem *find(uintptr_t p, size_t n, int kind) {
	for (struct mem *m = mems; m; m = m->next) {
		if (kind && m->kind != kind) continue;
		if (p >= m->p && p - m->p < m->n && n <= m->n - (p - m->p)) return m;
	}
	return NULL;
}

static void add(struct mem *m) { m->next = mems; mems = m; }

static void drop(struct mem *x) {
	for (struct mem **m = &mems; *m; m = &(*m)->next)
		if (*m == x) { *m = x->next; return; }
}

static int is_dev(uintptr_t p, size_t n) { return find(p, n, M_DEV) || find(p, n, M_IMPORT); }

hipError_t hipMalloc(void **p, size_t n) {
	SETUP();
	if (!p || n == 0) return E_VALUE;
	if (!heap) return E_OOM;
	pthread_mutex_lock(&mu);
	if (n > HEAP_SIZE || heap_top + PAGE + up(n) > HEAP_SIZE) { pthread_mutex_unlock(&mu); return E_OOM; }
	struct mem *m = calloc(1, sizeof *m);
	m->kind = M_DEV;
	m->dev = cur;
	m->meta = (struct meta *)(heap + heap_top);
	m->p = (uintptr_t)(heap + heap_top + PAGE);
	m->n = n;
	m->maplen = up(n);
	heap_top += PAGE + up(n);
	*m->meta = (struct meta){ .magic = MAGIC, .size = n, .gen = next_gen++ };
	add(m);
	pthread_mutex_unlock(&mu);
	*p = (void *)m->p;
	return OK;
}

hipError_t hipFree(void *p) {
	SETUP();
	if (!p) return OK;
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, 0, M_DEV);
	hipError_t rc = OK;
	if (!m || m->p != (uintptr_t)p) rc = E_DEVPTR;
	else if (__atomic_load_n(&m->meta->importers, __ATOMIC_ACQUIRE) > 0) rc = E_VALUE; /* stricter: importers close first */
	else drop(m);
	pthread_mutex_unlock(&mu);
	if (rc) return rc;
	m->meta->magic = 0;
	/* Give the pages back; the addresses are never handed out again. */
	fallocate(heap_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)((char *)m->meta - heap), (off_t)(PAGE + m->maplen));
	free(m);
	return OK;
}

hipError_t hipHostMalloc(void **p, size_t n, unsigned int flags) {
	SETUP();
	if (!p || n == 0 || (flags & ~0x7u)) return E_VALUE;
	__atomic_store_n(&last_host_flags, (long)flags, __ATOMIC_RELAXED);
	if (host_limit && n > (size_t)host_limit) return E_OOM;
	void *a = mmap(NULL, up(n), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED) return E_OOM;
	struct mem *m = calloc(1, sizeof *m);
	*m = (struct mem){ .kind = M_HOST, .dev = cur, .p = (uintptr_t)a, .n = n, .maplen = up(n), .flags = flags };
	pthread_mutex_lock(&mu);
	add(m);
	pthread_mutex_unlock(&mu);
	*p = a;
	return OK;
}

hipError_t hipHostFree(void *p) {
	SETUP();
	if (!p) return OK;
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, 0, M_HOST);
	if (!m || m->p != (uintptr_t)p) { pthread_mutex_unlock(&mu); return E_VALUE; }
	drop(m);
	pthread_mutex_unlock(&mu);
	munmap(p, m->maplen);
	free(m);
	return OK;
}

hipError_t hipHostGetDevicePointer(void **d, void *h, unsigned int flags) {
	SETUP();
	if (!d || flags || no_devptr) return E_VALUE;
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)h, 1, M_HOST);
	int ok = m && (m->flags & 0x2);
	pthread_mutex_unlock(&mu);
	if (!ok) return E_VALUE; /* not hipHostMalloc'd with hipHostMallocMapped */
	*d = (void *)((uintptr_t)h | VIEW_BIT);
	return OK;
}

hipError_t hipMemGetAddressRange(void **base, size_t *size, void *p) {
	SETUP();
	if (!base || !size) return E_VALUE;
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, 1, M_DEV);
	if (!m) m = find((uintptr_t)p, 1, M_IMPORT);
	if (m) { *base = (void *)m->p; *size = m->n; }
	pthread_mutex_unlock(&mu);
	return m ? OK : E_DEVPTR;
}

/* check_copy validates a copy against what kind says the two sides are; it
 * sets *pageable when the host side is not pinned. */
static hipError_t check_copy(void *dst, const void *src, size_t n, int kind, int *pageable) {
	uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src, host = 0;
	*pageable = 0;
	if (!dst || !src) return E_VALUE;
	pthread_mutex_lock(&mu);
	hipError_t rc = OK;
	switch (kind) {
	case H2D: if (!is_dev(d, n)) rc = E_VALUE; host = s; break;
	case D2H: if (!is_dev(s, n)) rc = E_VALUE; host = d; break;
	case D2D: if (!is_dev(s, n) || !is_dev(d, n)) rc = E_VALUE; break;
	default: rc = E_VALUE; /* host-to-host and hipMemcpyDefault: stage never uses them */
	}
	if (!rc && host) {
		if (host & VIEW_BIT) rc = E_VALUE; /* the device view is not a host address */
		else if (is_dev(host, n)) rc = E_VALUE;
		else if (!find(host, n, M_HOST)) *pageable = 1;
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

hipError_t hipMemcpy(void *dst, const void *src, size_t n, int kind) {
	SETUP();
	int pageable;
	hipError_t rc = check_copy(dst, src, n, kind, &pageable);
	if (rc) return rc;
	memmove(dst, src, n);
	return OK;
}

/* ---- streams and events ---- */

struct event { uint64_t recorded, done; hipError_t err; unsigned flags; };
struct task { int copy; void *dst; const void *src; size_t n; long seq; struct event *ev; uint64_t gen; struct task *next; };
struct stream {
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv, idle;
	struct task *head, *tail;
	int busy, stop, dev;
	hipError_t err;
};

static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER, pause_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER, pause_cv = PTHREAD_COND_INITIALIZER;
static int paused;

static void run(struct stream *s, struct task *t, hipError_t failed) {
	pthread_mutex_lock(&pause_mu);
	while (paused) pthread_cond_wait(&pause_cv, &pause_mu);
	pthread_mutex_unlock(&pause_mu);
	if (t->copy) {
		if (failed) return; /* a failed stream copies nothing more */
		if (fail_copy_at && t->seq == fail_copy_at) {
			pthread_mutex_lock(&s->mu);
			s->err = E_ILLEGAL;
			pthread_mutex_unlock(&s->mu);
			return;
		}
		memmove(t->dst, t->src, t->n);
		return;
	}
	pthread_mutex_lock(&ev_mu);
	t->ev->err = failed;
	__atomic_store_n(&t->ev->done, t->gen, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&ev_cv);
	pthread_mutex_unlock(&ev_mu);
}

static void *worker(void *arg) {
	struct stream *s = arg;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
		if (!s->head) break;
		struct task *t = s->head;
		s->head = t->next;
		if (!s->head) s->tail = NULL;
		s->busy = 1;
		hipError_t failed = s->err;
		pthread_mutex_unlock(&s->mu);
		run(s, t, failed); /* tasks run in order: failed includes every copy before t */
		free(t);
		pthread_mutex_lock(&s->mu);
		s->busy = 0;
		if (!s->head) pthread_cond_broadcast(&s->idle);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static void push(struct stream *s, struct task *t) {
	pthread_mutex_lock(&s->mu);
	if (s->tail) s->tail->next = t;
	else s->head = t;
	s->tail = t;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static hipError_t wait_idle(struct stream *s) {
	pthread_mutex_lock(&s->mu);
	while (s->head || s->busy) pthread_cond_wait(&s->idle, &s->mu);
	hipError_t err = s->err;
	pthread_mutex_unlock(&s->mu);
	return err;
}

hipError_t hipStreamCreateWithFlags(void **out, unsigned int flags) {
	SETUP();
	if (!out || flags > 1) return E_VALUE;
	__atomic_store_n(&last_stream_flags, (long)flags, __ATOMIC_RELAXED);
	struct stream *s = calloc(1, sizeof *s);
	s->dev = cur;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	pthread_cond_init(&s->idle, NULL);
	if (pthread_create(&s->th, NULL, worker, s) != 0) { free(s); return E_OOM; }
	__atomic_add_fetch(&n_streams, 1, __ATOMIC_RELAXED);
	*out = s;
	return OK;
}

hipError_t hipStreamDestroy(void *p) {
	SETUP();
	struct stream *s = p;
	if (!s) return E_HANDLE;
	pthread_mutex_lock(&s->mu);
	s->stop = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->th, NULL);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	pthread_cond_destroy(&s->idle);
	free(s);
	__atomic_sub_fetch(&n_streams, 1, __ATOMIC_RELAXED);
	return OK;
}

hipError_t hipStreamSynchronize(void *s) { SETUP(); return s ? wait_idle(s) : E_HANDLE; }

hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *st) {
	SETUP();
	if (!st) return E_HANDLE; /* the null stream is not emulated: stage never uses it */
	int pageable;
	hipError_t rc = check_copy(dst, src, n, kind, &pageable);
	if (rc) return rc;
	if (pageable) {
		rc = wait_idle(st);
		if (rc) return rc;
		memmove(dst, src, n);
		__atomic_add_fetch(&n_sync_copies, 1, __ATOMIC_RELAXED);
		return OK;
	}
	struct task *t = calloc(1, sizeof *t);
	*t = (struct task){ .copy = 1, .dst = dst, .src = src, .n = n, .seq = __atomic_add_fetch(&n_copies, 1, __ATOMIC_RELAXED) };
	push(st, t);
	return OK;
}

hipError_t hipEventCreateWithFlags(void **e, unsigned int flags) {
	SETUP();
	if (!e || (flags & ~0x7u) || ((flags & 0x4) && !(flags & 0x2))) return E_VALUE;
	__atomic_store_n(&last_event_flags, (long)flags, __ATOMIC_RELAXED);
	struct event *ev = calloc(1, sizeof *ev);
	ev->flags = flags;
	__atomic_add_fetch(&n_events, 1, __ATOMIC_RELAXED);
	*e = ev;
	return OK;
}

hipError_t hipEventDestroy(void *e) {
	SETUP();
	if (!e) return E_HANDLE;
	free(e);
	__atomic_sub_fetch(&n_events, 1, __ATOMIC_RELAXED);
	return OK;
}

hipError_t hipEventRecord(void *e, void *st) {
	SETUP();
	if (!e || !st) return E_HANDLE;
	struct event *ev = e;
	struct task *t = calloc(1, sizeof *t);
	t->ev = ev;
	t->gen = __atomic_add_fetch(&ev->recorded, 1, __ATOMIC_ACQ_REL);
	push(st, t);
	return OK;
}

hipError_t hipEventQuery(void *e) {
	SETUP();
	struct event *ev = e;
	if (!ev) return E_HANDLE;
	pthread_mutex_lock(&ev_mu);
	hipError_t rc = ev->done != __atomic_load_n(&ev->recorded, __ATOMIC_ACQUIRE) ? E_NOT_READY : ev->err;
	pthread_mutex_unlock(&ev_mu);
	return rc;
}

hipError_t hipEventSynchronize(void *e) {
	SETUP();
	struct event *ev = e;
	if (!ev) return E_HANDLE;
	pthread_mutex_lock(&ev_mu);
	while (ev->done != __atomic_load_n(&ev->recorded, __ATOMIC_ACQUIRE)) pthread_cond_wait(&ev_cv, &ev_mu);
	hipError_t rc = ev->err;
	pthread_mutex_unlock(&ev_mu);
	return rc;
}

/* ---- IPC ---- */

hipError_t hipIpcGetMemHandle(void *out, void *p) {
	SETUP();
	if (!out) return E_VALUE;
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, 1, M_DEV);
	if (!m) { pthread_mutex_unlock(&mu); return E_DEVPTR; }
	if ((uintptr_t)p != m->p) __atomic_add_fetch(&n_interior, 1, __ATOMIC_RELAXED);
	struct handle h = { .magic = MAGIC, .pid = (int32_t)getpid(), .fd = heap_fd,
	                    .metaoff = (uint64_t)((char *)m->meta - heap), .size = m->n, .gen = m->meta->gen };
	__atomic_store_n(&m->meta->exported, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&mu);
	memcpy(out, &h, sizeof h);
	return OK;
}

/* The handle arrives by value, as in hip_runtime_api.h. */
typedef struct { char reserved[64]; } hipIpcMemHandle_t;

hipError_t hipIpcOpenMemHandle(void **p, hipIpcMemHandle_t hv, unsigned int flags) {
	SETUP();
	struct handle h;
	memcpy(&h, hv.reserved, sizeof h);
	__atomic_store_n(&last_ipc_flags, (long)flags, __ATOMIC_RELAXED);
	if (!p || flags > 1 || h.magic != MAGIC || h.metaoff % PAGE) return E_VALUE;
	pthread_mutex_lock(&mu);
	for (struct mem *m = mems; m; m = m->next)
		if (m->kind == M_IMPORT && memcmp(&m->h, &h, sizeof h) == 0) { pthread_mutex_unlock(&mu); return E_MAPPED; }
	pthread_mutex_unlock(&mu);
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
	int f = open(path, O_RDWR | O_CLOEXEC);
	if (f < 0) return E_VALUE; /* exporter gone */
	struct meta *meta = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, f, (off_t)h.metaoff);
	if (meta == MAP_FAILED || meta->magic != MAGIC || !__atomic_load_n(&meta->exported, __ATOMIC_ACQUIRE) ||
	    meta->gen != h.gen || meta->size != h.size) {
		if (meta != MAP_FAILED) munmap(meta, PAGE);
		close(f);
		return E_VALUE; /* freed, or not a handle of ours */
	}
	void *a = mmap(NULL, up(h.size), PROT_READ | PROT_WRITE, MAP_SHARED, f, (off_t)(h.metaoff + PAGE));
	close(f);
	if (a == MAP_FAILED) { munmap(meta, PAGE); return E_OOM; }
	__atomic_add_fetch(&meta->importers, 1, __ATOMIC_ACQ_REL);
	struct mem *m = calloc(1, sizeof *m);
	*m = (struct mem){ .kind = M_IMPORT, .dev = cur, .p = (uintptr_t)a, .n = h.size, .maplen = up(h.size), .meta = meta, .h = h };
	pthread_mutex_lock(&mu);
	add(m);
	pthread_mutex_unlock(&mu);
	__atomic_add_fetch(&n_opens, 1, __ATOMIC_RELAXED);
	*p = a; /* the allocation BASE */
	return OK;
}

hipError_t hipIpcCloseMemHandle(void *p) {
	SETUP();
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, 0, M_IMPORT);
	if (!m || m->p != (uintptr_t)p) { pthread_mutex_unlock(&mu); return E_VALUE; }
	drop(m);
	pthread_mutex_unlock(&mu);
	munmap(p, m->maplen);
	__atomic_sub_fetch(&m->meta->importers, 1, __ATOMIC_ACQ_REL);
	munmap(m->meta, PAGE);
	free(m);
	__atomic_add_fetch(&n_closes, 1, __ATOMIC_RELAXED);
	return OK;
}

/* ---- test hooks ---- */

static long count(int kind) {
	pthread_mutex_lock(&mu);
	long n = 0;
	for (struct mem *m = mems; m; m = m->next) n += !kind || m->kind == kind;
	pthread_mutex_unlock(&mu);
	return n;
}

long fakehip_live(void) { return count(0) + __atomic_load_n(&n_streams, __ATOMIC_RELAXED) + __atomic_load_n(&n_events, __ATOMIC_RELAXED); }
long fakehip_pinned(void) { return count(M_HOST); }
long fakehip_imports(void) { return count(M_IMPORT); }
long fakehip_pause(void) { pthread_mutex_lock(&pause_mu); paused = 1; pthread_mutex_unlock(&pause_mu); return 0; }
long fakehip_resume(void) {
	pthread_mutex_lock(&pause_mu);
	paused = 0;
	pthread_cond_broadcast(&pause_cv);
	pthread_mutex_unlock(&pause_mu);
	return 0;
}
/* fakehip_device_of returns the device of the allocation or stream holding
 * address a, or -1. */
long fakehip_device_of(long a) {
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)a, 1, 0);
	long d = m ? m->dev : -1;
	pthread_mutex_unlock(&mu);
	return d;
}
long fakehip_stream_device(long s) { return s ? ((struct stream *)(uintptr_t)s)->dev : -1; }
long fakehip_init_calls(void) { return n_init; }
long fakehip_copies(void) { return n_copies; }
long fakehip_sync_copies(void) { return n_sync_copies; }
long fakehip_ipc_opens(void) { return n_opens; }
long fakehip_ipc_closes(void) { return n_closes; }
long fakehip_interior_exports(void) { return n_interior; }
long fakehip_last_stream_flags(void) { return last_stream_flags; }
long fakehip_last_event_flags(void) { return last_event_flags; }
long fakehip_last_host_flags(void) { return last_host_flags; }
long fakehip_last_ipc_flags(void) { return last_ipc_flags; }
