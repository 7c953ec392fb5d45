/* fakeacl.c: an emulation of the slice of libascendcl.so that stage binds,
 * over host memory, for the CPU tests (built with gcc into a .so).
 *
 * What it models, after the CANN documentation:
 *   - contexts bound per OS thread: aclrtSetDevice (reference counted) or
 *     aclrtSetCurrentContext; calls without one fail with 107002;
 *   - "device memory" is carved out of one memfd per process (the heap,
 *     made at aclInit, mapped once), so that another process can map it:
 *     IPC export keys name the heap as /proc/<pid>/fd/<fd> plus offsets; a
 *     metadata page before each allocation holds the pid whitelist and the
 *     importer count, shared between processes. Freed ranges are punched
 *     out of the heap and never reused;
 *   - pinned host memory (aclrtMallocHost) and registered host memory
 *     (aclrtHostRegister, MAPPED) whose device view is an address the host
 *     cannot use (bit 62 set): passing it to a memcpy is refused;
 *   - each stream runs its tasks in order on a worker thread; events
 *     complete when the worker reaches them; aclrtQueryEventStatus says
 *     NOT_READY 0 / COMPLETE 1, the legacy aclrtQueryEvent the inverse;
 *   - a failed copy (injected) fails its stream: later tasks are dropped,
 *     events after it stay NOT_READY, synchronize returns the error;
 *   - async copies with pageable host memory run synchronously (counted);
 *   - aclGetRecentErrMsg: per thread, cleared when read;
 *   - virtual memory (VMM): aclrtMallocPhysical carves a physical chunk out
 *     of the heap memfd; aclrtReserveMemAddress reserves an inaccessible
 *     range; aclrtMapMem maps a chunk (its whole size, offset 0) at an
 *     address inside one reservation; aclrtMemSetAccess sets the mapping's
 *     rights (READ or READWRITE; an imported chunk's mapping has none until
 *     then); aclrtMemGetAddressRange of a mapped address is that mapping;
 *     aclrtMemRetainAllocationHandle takes a mapping's start.
 *     aclrtMemExportToShareableHandle names a chunk as (exporter pid << 40 |
 *     heap fd << 24 | page of its metadata in the heap); another process
 *     imports it with aclrtMemImportFromShareableHandle (never the exporter
 *     itself, each handle once per process) through /proc/<pid>/fd/<fd>.
 *     The pid whitelist (aclrtMemSetPidToShareableHandle,
 *     aclrtIpcMemSetImportPid) holds BareTgids: an import is allowed when the
 *     importer's aclrtDeviceGetBareTgid is on it;
 *   - devices: FAKEACL_DEVICES logical devices, or those that
 *     ASCEND_RT_VISIBLE_DEVICES lists (logical i is physical list[i]). Every
 *     allocation remembers its physical device; memory imported on another
 *     physical device cannot be the source or target of an H2D or D2H copy
 *     (CANN, aclrtIpcMemGetExportKey), nor of a copy on a context of
 *     another device.
 *
 * Build flags:
 *   -DFAKEACL_NO_BATCH          do not export aclrtMemcpyBatchAsync
 *   -DFAKEACL_NO_STREAM_CONFIG  do not export aclrtCreateStreamWithConfig
 *   -DFAKEACL_NO_IPC            do not export the aclrtIpcMem* calls
 *   -DFAKEACL_NO_VMM            do not export the VMM calls
 *   -DFAKEACL_NO_BARE_TGID      do not export aclrtDeviceGetBareTgid
 * Environment (read at aclInit):
 *   FAKEACL_INIT_ERR=N            aclInit returns N
 *   FAKEACL_DEVICES=N             number of devices (default 1)
 *   FAKEACL_FAIL_COPY=N           the Nth async copy enqueued fails (507013) when it runs
 *   FAKEACL_BATCH_UNSUPPORTED=1   aclrtMemcpyBatchAsync returns 207000
 *   FAKEACL_NO_HOST_REGISTER=1    aclrtHostRegister returns 207000
 *   FAKEACL_STREAM_CONFIG_ERR=N   aclrtCreateStreamWithConfig returns N
 *   FAKEACL_GRANULARITY=N         VMM granularity in bytes (default 2 MiB; a multiple of 4096)
 *   ASCEND_RT_VISIBLE_DEVICES=a,b physical devices behind logical 0, 1, ...
 * Environment (read at each call):
 *   FAKEACL_TGID_OFFSET=N         aclrtDeviceGetBareTgid is getpid() + N (a pid
 *                                 namespace: the driver's pid differs from getpid)
 * Test hooks (long f(void)): fakeacl_live, fakeacl_pause, fakeacl_resume and
 * counters (see the end of the file). */
#define FAKE_NAME "fakeacl"
#define FAKE_NCTX 8
#define FAKE_BIND(dev) OK
#include "fakeacl_common.h"
#include <sys/stat.h>

enum { H2H = 0, H2D = 1, D2H = 2, D2D = 3 };

#define VIEW_BIT (1ULL << 62) /* device views of host memory: not host addresses */
#define MAGIC 0x41434c46u     /* "FLCA" */

/* ---- init, devices, contexts ---- */

static int initialized, ndev = 1, batch_unsupported, no_host_register, stream_config_err;
static long fail_copy_at;
static long n_vmm_maps; /* live aclrtMapMem mappings */
static long n_init, n_copies, n_sync_copies, n_batch, n_legacy_query, n_d2d, n_stream_config;

static int phys_of[8]; /* logical -> physical device (ASCEND_RT_VISIBLE_DEVICES) */
static size_t granularity = 2UL << 20;
static aclError heap_init(void);

aclError aclInit(const char *cfg) {
	(void)cfg;
	__atomic_add_fetch(&n_init, 1, __ATOMIC_RELAXED);
	long e = envl("FAKEACL_INIT_ERR", 0);
	if (e) return fail((aclError)e, "fakeacl: aclInit failed as FAKEACL_INIT_ERR asked");
	pthread_mutex_lock(&mu);
	int again = initialized;
	initialized = 1;
	ndev = (int)envl("FAKEACL_DEVICES", 1);
	if (ndev < 1 || ndev > 8) ndev = 1;
	for (int i = 0; i < 8; i++) phys_of[i] = i;
	const char *vis = getenv("ASCEND_RT_VISIBLE_DEVICES");
	if (vis && *vis) {
		int n = 0;
		for (const char *q = vis; *q && n < 8;) {
			char *end;
			long v = strtol(q, &end, 10);
			if (end == q || v < 0 || v > 63) break;
			phys_of[n++] = (int)v;
			q = *end == ',' ? end + 1 : end;
			if (!*end) break;
		}
		if (n > 0) ndev = n;
	}
	granularity = (size_t)envl("FAKEACL_GRANULARITY", 2L << 20);
	if (granularity == 0 || granularity % 4096) granularity = 2UL << 20;
	fail_copy_at = envl("FAKEACL_FAIL_COPY", 0);
	batch_unsupported = (int)envl("FAKEACL_BATCH_UNSUPPORTED", 0);
	no_host_register = (int)envl("FAKEACL_NO_HOST_REGISTER", 0);
	stream_config_err = (int)envl("FAKEACL_STREAM_CONFIG_ERR", 0);
	aclError rc = heap_init();
	pthread_mutex_unlock(&mu);
	if (rc) return rc;
	if (again) return fail(E_REPEAT_INIT, "fakeacl: aclInit: already initialized");
	return OK;
}

aclError aclrtGetDeviceCount(uint32_t *n) {
	if (!initialized) return fail(100001, "fakeacl: aclInit first");
	*n = (uint32_t)ndev;
	return OK;
}

aclError aclrtSetDevice(int32_t dev) {
	if (!initialized) return fail(100001, "fakeacl: aclInit first");
	if (dev < 0 || dev >= ndev) return fail(E_RT_DEVICE, "fakeacl: device %d of %d", dev, ndev);
	__atomic_add_fetch(&ctxs[dev].refs, 1, __ATOMIC_ACQ_REL);
	ctxs[dev].dev = dev;
	cur = &ctxs[dev];
	__atomic_add_fetch(&n_setdevice, 1, __ATOMIC_RELAXED);
	return OK;
}

aclError aclrtResetDevice(int32_t dev) {
	if (dev < 0 || dev >= ndev) return fail(E_RT_DEVICE, "fakeacl: device %d of %d", dev, ndev);
	if (__atomic_sub_fetch(&ctxs[dev].refs, 1, __ATOMIC_ACQ_REL) < 0) {
		__atomic_add_fetch(&ctxs[dev].refs, 1, __ATOMIC_ACQ_REL);
		return fail(E_RT_DEVICE, "fakeacl: aclrtResetDevice(%d) without aclrtSetDevice", dev);
	}
	return OK;
}

aclError aclrtGetPhyDevIdByLogicDevId(const int32_t logic, int32_t *const phys) {
	if (!initialized) return fail(100001, "fakeacl: aclInit first");
	if (logic < 0 || logic >= ndev || !phys) return fail(E_RT_DEVICE, "fakeacl: aclrtGetPhyDevIdByLogicDevId(%d): device %d of %d", logic, logic, ndev);
	*phys = phys_of[logic];
	return OK;
}

/* cur_phys: the physical device of the calling thread's context. */
static int cur_phys(void) { return phys_of[cur->dev]; }

/* ---- memory table ---- */

enum { M_DEV = 1, M_IMPORT, M_HOST, M_HOSTREG, M_PHYS, M_PIMPORT, M_RESERVE, M_MAPPED };

/* The last page of every device allocation's memfd, shared by exporter
 * and importers. */
struct meta {
	uint32_t magic, exported, no_validation, npids;
	int32_t importers;
	int32_t pids[MAX_PIDS];
	uint64_t size;
	int32_t dev;  /* physical device of the memory */
	uint32_t vmm; /* 1: a physical chunk (aclrtMallocPhysical), exported by shareable handle */
};

struct mem {
	int kind;
	uintptr_t p;
	size_t n;
	uintptr_t view;  /* M_HOSTREG: the device view */
	size_t maplen;   /* bytes mapped at p */
	struct meta *meta;
	char key[65];    /* M_DEV: exported key; M_IMPORT: imported key */
	int dev;         /* physical device of the memory (M_DEV, M_IMPORT, M_PHYS, M_PIMPORT) */
	/* VMM. M_PHYS/M_PIMPORT (p = 0: not an address): the chunk's bytes are
	 * [off, off+n) of fd; refs counts the handle's owners (malloc or import,
	 * then each retain), maps its mappings. M_RESERVE: [p, p+n) reserved;
	 * bound says what was mapped in it (0 none, M_PHYS or M_PIMPORT) and
	 * bound_dev on which device. M_MAPPED: phys is the chunk, access the
	 * aclrtMemAccessFlags granted. */
	int fd;
	off_t off;
	long refs, maps;
	uint64_t shareable;
	struct mem *phys;
	int access, bound, bound_dev;
	struct mem *next;
};
static struct mem *mems;

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

static struct mem *find_view(uintptr_t p) {
	for (struct mem *m = mems; m; m = m->next)
		if (m->kind == M_HOSTREG && p >= m->view && p - m->view < m->n) return m;
	return NULL;
}

/* dev_mem returns the device memory (aclrtMalloc, key import, or a VMM
 * mapping) that holds [p, p+n), or NULL. */
static __thread int span_access; /* dev_mem of VMM memory: the rights all its mappings share */

/* mapped_cover returns the mapping at p when [p, p+n) lies in mappings
 * that follow each other without a gap (a tensor over several chunks of
 * one reservation), all of one device; span_access gets their common
 * rights. */
static struct mem *mapped_cover(uintptr_t p, size_t n) {
	struct mem *first = find(p, 0, M_MAPPED);
	if (!first) return NULL;
	int acc = first->access;
	struct mem *m = first;
	while (n > m->n - (p - m->p)) {
		n -= m->n - (p - m->p);
		p = m->p + m->n;
		struct mem *next = find(p, 0, M_MAPPED);
		if (!next || next->phys->dev != first->phys->dev) return NULL;
		acc &= next->access;
		m = next;
	}
	span_access = acc;
	return first;
}

static struct mem *dev_mem(uintptr_t p, size_t n) {
	struct mem *m = find(p, n, M_DEV);
	if (!m) m = find(p, n, M_IMPORT);
	if (!m) m = mapped_cover(p, n);
	return m;
}
static int is_dev(uintptr_t p, size_t n) { return dev_mem(p, n) != NULL; }
static int is_pinned(uintptr_t p, size_t n) { return find(p, n, M_HOST) || find(p, n, M_HOSTREG); }

/* The heap: device allocations are [meta page][data] ranges of one memfd. */
#define HEAP_SIZE (64UL << 30)
static int heap_fd = -1;
static char *heap;
static size_t heap_top;

static aclError heap_init(void) {
	if (heap) return OK;
	int fd = memfd_create("fakeacl-device-heap", MFD_CLOEXEC);
	if (fd < 0) return fail(E_MEM_ALLOC, "fakeacl: memfd_create: %s", strerror(errno));
	if (ftruncate(fd, (off_t)HEAP_SIZE) != 0) {
		close(fd);
		return fail(E_MEM_ALLOC, "fakeacl: ftruncate heap: %s", strerror(errno));
	}
	void *h = mmap(NULL, HEAP_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	if (h == MAP_FAILED) {
		close(fd);
		return fail(E_MEM_ALLOC, "fakeacl: mmap heap: %s", strerror(errno));
	}
	heap_fd = fd;
	heap = h;
	return OK;
}

aclError aclrtMalloc(void **p, size_t n, int policy) {
	NEED_CTX();
	if (policy < 0 || policy > 2) return fail(E_RT_PARAM, "fakeacl: aclrtMalloc: policy %d", policy);
	if (n == 0) return fail(E_RT_PARAM, "fakeacl: aclrtMalloc(0)");
	pthread_mutex_lock(&mu);
	if (n > HEAP_SIZE || heap_top + PAGE + up(n) > HEAP_SIZE) {
		pthread_mutex_unlock(&mu);
		return fail(E_MEM_ALLOC, "fakeacl: aclrtMalloc(%zu B): out of device memory", n);
	}
	struct mem *m = calloc(1, sizeof *m);
	m->kind = M_DEV;
	m->meta = (struct meta *)(heap + heap_top);
	m->p = (uintptr_t)(heap + heap_top + PAGE);
	m->n = n;
	m->maplen = up(n);
	heap_top += PAGE + up(n);
	m->meta->magic = MAGIC;
	m->meta->size = n;
	m->meta->dev = cur_phys();
	m->dev = cur_phys();
	add(m);
	pthread_mutex_unlock(&mu);
	*p = (void *)m->p;
	return OK;
}

aclError aclrtFree(void *p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, 0, M_DEV);
	if (!m || m->p != (uintptr_t)p) {
		pthread_mutex_unlock(&mu);
		return fail(E_RT_PARAM, "fakeacl: aclrtFree(%p): not an aclrtMalloc allocation", p);
	}
	if (m->key[0]) {
		pthread_mutex_unlock(&mu);
		return fail(E_IPC, "fakeacl: aclrtFree(%p): its export key %s is still open (aclrtIpcMemClose first)", p, m->key);
	}
	drop(m);
	pthread_mutex_unlock(&mu);
	/* Give the pages back; the addresses are never handed out again. */
	fallocate(heap_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)((char *)m->meta - heap), (off_t)(PAGE + m->maplen));
	free(m);
	return OK;
}

aclError aclrtMallocHost(void **p, size_t n) {
	NEED_CTX();
	if (n == 0) return fail(E_RT_PARAM, "fakeacl: aclrtMallocHost(0)");
	void *a = mmap(NULL, up(n), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED) return fail(E_MEM_ALLOC, "fakeacl: aclrtMallocHost(%zu): %s", n, strerror(errno));
	struct mem *m = calloc(1, sizeof *m);
	m->kind = M_HOST;
	m->p = (uintptr_t)a;
	m->n = n;
	m->maplen = up(n);
	pthread_mutex_lock(&mu);
	add(m);
	pthread_mutex_unlock(&mu);
	*p = a;
	return OK;
}

aclError aclrtFreeHost(void *p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, 0, M_HOST);
	if (!m || m->p != (uintptr_t)p) {
		pthread_mutex_unlock(&mu);
		return fail(E_RT_PARAM, "fakeacl: aclrtFreeHost(%p): not an aclrtMallocHost allocation", p);
	}
	if (find((uintptr_t)p, 0, M_HOSTREG)) {
		pthread_mutex_unlock(&mu);
		return fail(E_RT_PARAM, "fakeacl: aclrtFreeHost(%p): still registered (aclrtHostUnregister first)", p);
	}
	drop(m);
	pthread_mutex_unlock(&mu);
	munmap(p, m->maplen);
	free(m);
	return OK;
}

aclError aclrtHostRegister(void *p, uint64_t n, int type, void **dev) {
	NEED_CTX();
	if (no_host_register) return fail(E_FEATURE, "fakeacl: aclrtHostRegister: not supported on this device (FAKEACL_NO_HOST_REGISTER)");
	if (type != 0) return fail(E_RT_PARAM, "fakeacl: aclrtHostRegister: type %d, want MAPPED (0)", type);
	if ((uintptr_t)p % PAGE || n == 0) return fail(E_RT_PARAM, "fakeacl: aclrtHostRegister(%p, %llu): want a 4K-aligned pointer and a size", p, (unsigned long long)n);
	pthread_mutex_lock(&mu);
	for (struct mem *m = mems; m; m = m->next) {
		if (m->kind == M_HOSTREG && (uintptr_t)p < m->p + m->n && m->p < (uintptr_t)p + n) {
			pthread_mutex_unlock(&mu);
			return fail(E_ALREADY_REGISTERED, "fakeacl: aclrtHostRegister(%p): overlaps registered memory", p);
		}
	}
	struct mem *m = calloc(1, sizeof *m);
	m->kind = M_HOSTREG;
	m->p = (uintptr_t)p;
	m->n = (size_t)n;
	m->view = (uintptr_t)p | VIEW_BIT;
	add(m);
	pthread_mutex_unlock(&mu);
	*dev = (void *)m->view;
	return OK;
}

aclError aclrtHostUnregister(void *p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, 0, M_HOSTREG);
	if (!m || m->p != (uintptr_t)p) {
		pthread_mutex_unlock(&mu);
		return fail(E_NOT_REGISTERED, "fakeacl: aclrtHostUnregister(%p): not registered", p);
	}
	drop(m);
	pthread_mutex_unlock(&mu);
	free(m);
	return OK;
}

aclError aclrtMemGetAddressRange(void *p, void **base, size_t *size) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = dev_mem((uintptr_t)p, 0);
	if (!m) m = find((uintptr_t)p, 0, M_HOST);
	if (m) {
		/* A VMM address answers with its mapping: one chunk, as mapped. */
		*base = (void *)m->p;
		*size = m->n;
	}
	pthread_mutex_unlock(&mu);
	return m ? OK : fail(E_RT_PARAM, "fakeacl: aclrtMemGetAddressRange(%p): unknown address (or reserved and not mapped)", p);
}

/* check_copy validates a copy against what kind says the two sides are.
 * It returns OK, sets *pageable when the host side is not pinned. */
static aclError check_copy(void *dst, size_t dmax, const void *src, size_t n, int kind, int *pageable) {
	uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
	*pageable = 0;
	if (!dst || !src) return fail(E_RT_PARAM, "fakeacl: copy with a NULL address");
	if (n > dmax) return fail(E_RT_PARAM, "fakeacl: copy of %zu B into destMax %zu", n, dmax);
	pthread_mutex_lock(&mu);
	aclError rc = OK;
	const char *what = NULL;
	uintptr_t host = 0;
	struct mem *dm = NULL;
	switch (kind) {
	case H2D:
		if (!(dm = dev_mem(d, n))) what = "H2D destination is not device memory";
		else if (dm->kind == M_MAPPED && span_access != 3) what = "H2D destination is a VMM mapping without write access (aclrtMemSetAccess READWRITE)";
		host = s;
		break;
	case D2H:
		if (!(dm = dev_mem(s, n))) what = "D2H source is not device memory";
		else if (dm->kind == M_MAPPED && !(span_access & 1)) what = "D2H source is a VMM mapping without read access (aclrtMemSetAccess)";
		host = d;
		break;
	case D2D:
		if (!is_dev(s, n) || !is_dev(d, n)) what = "D2D side is not device memory";
		break;
	case H2H:
		host = d;
		break;
	default:
		what = "unknown aclrtMemcpyKind";
	}
	if (!what && dm) {
		int memdev = dm->kind == M_MAPPED ? dm->phys->dev : dm->dev;
		if (memdev != cur_phys()) {
			static __thread char why[256];
			snprintf(why, sizeof why, "the device memory is on physical device %d, this context's device is physical %d: memory imported from another device cannot be the source or target of H2D/D2H copies", memdev, cur_phys());
			what = why;
		}
	}
	if (!what && host) {
		if (find_view(host) || (host & VIEW_BIT)) what = "host side is the DEVICE view of registered host memory, which is not a memcpy address";
		else if (is_dev(host, n)) what = "host side is device memory";
		else if (!is_pinned(host, n)) *pageable = 1;
	}
	if (what) rc = fail(E_RT_PARAM, "fakeacl: copy %p <- %p (%zu B, kind %d): %s", dst, src, n, kind, what);
	pthread_mutex_unlock(&mu);
	return rc;
}

aclError aclrtMemcpy(void *dst, size_t dmax, const void *src, size_t n, int kind) {
	NEED_CTX();
	int pageable;
	aclError rc = check_copy(dst, dmax, src, n, kind, &pageable);
	if (rc) return rc;
	memmove(dst, src, n);
	return OK;
}

/* ---- streams ---- */

enum { T_COPY = 1, T_RECORD };

struct event {
	uint64_t recorded; /* generation of the last record */
	uint64_t done;     /* generation the worker reached */
	uint32_t flags;
};

struct task {
	int type;
	void *dst;
	const void *src;
	size_t n;
	long seq;
	struct event *ev;
	uint64_t gen;
	struct task *next;
};

struct stream {
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv, idle;
	struct task *head, *tail;
	int busy, stop;
	aclError err;
	char errmsg[256];
};

static pthread_mutex_t pause_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pause_cv = PTHREAD_COND_INITIALIZER;
static int paused;
static long n_streams, n_events;

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
		int failed = s->err != 0;
		pthread_mutex_unlock(&s->mu);

		pthread_mutex_lock(&pause_mu);
		while (paused) pthread_cond_wait(&pause_cv, &pause_mu);
		pthread_mutex_unlock(&pause_mu);

		aclError err = OK;
		char msg[256] = "";
		if (failed) {
			/* A failed stream runs nothing more: its later events never complete. */
		} else if (t->type == T_COPY) {
			if (fail_copy_at && t->seq == fail_copy_at) {
				err = E_SYS_DMA;
				snprintf(msg, sizeof msg, "fakeacl: DMA error in async copy #%ld (%zu B %p -> %p), injected by FAKEACL_FAIL_COPY", t->seq, t->n, t->src, t->dst);
			} else {
				memmove(t->dst, t->src, t->n);
			}
		} else {
			__atomic_store_n(&t->ev->done, t->gen, __ATOMIC_RELEASE);
		}
		free(t);

		pthread_mutex_lock(&s->mu);
		if (err && !s->err) {
			s->err = err;
			memcpy(s->errmsg, msg, sizeof s->errmsg);
		}
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

/* wait_idle waits for s to run dry: ms < 0 forever. */
static aclError wait_idle(struct stream *s, int32_t ms) {
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	if (ms > 0) {
		dl.tv_sec += ms / 1000;
		dl.tv_nsec += (long)(ms % 1000) * 1000000L;
		if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
	}
	pthread_mutex_lock(&s->mu);
	while (s->head || s->busy) {
		if (ms < 0) pthread_cond_wait(&s->idle, &s->mu);
		else if (pthread_cond_timedwait(&s->idle, &s->mu, &dl) == ETIMEDOUT) {
			pthread_mutex_unlock(&s->mu);
			return fail(E_STREAM_TIMEOUT, "fakeacl: stream still busy after %d ms", ms);
		}
	}
	aclError err = s->err;
	char msg[256];
	memcpy(msg, s->errmsg, sizeof msg);
	pthread_mutex_unlock(&s->mu);
	if (err) return fail(err, "%s", msg);
	return OK;
}

static aclError new_stream(void **out) {
	struct stream *s = calloc(1, sizeof *s);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	pthread_cond_init(&s->idle, NULL);
	if (pthread_create(&s->th, NULL, worker, s) != 0) {
		free(s);
		return fail(207008, "fakeacl: no thread for a stream");
	}
	__atomic_add_fetch(&n_streams, 1, __ATOMIC_RELAXED);
	*out = s;
	return OK;
}

aclError aclrtCreateStream(void **s) { NEED_CTX(); return new_stream(s); }

#ifndef FAKEACL_NO_STREAM_CONFIG
aclError aclrtCreateStreamWithConfig(void **s, uint32_t prio, uint32_t flags) {
	NEED_CTX();
	__atomic_add_fetch(&n_stream_config, 1, __ATOMIC_RELAXED);
	if (stream_config_err) return fail(stream_config_err, "fakeacl: aclrtCreateStreamWithConfig refused (FAKEACL_STREAM_CONFIG_ERR)");
	if (prio != 0) return fail(E_RT_PARAM, "fakeacl: priority %u is reserved, must be 0", prio);
	if (flags & ~0x3fu) return fail(E_RT_PARAM, "fakeacl: stream flags %#x", flags);
	return new_stream(s);
}
#endif

aclError aclrtDestroyStream(void *p) {
	NEED_CTX();
	struct stream *s = p;
	if (!s) return fail(E_RT_PARAM, "fakeacl: aclrtDestroyStream(NULL)");
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

aclError aclrtSynchronizeStreamWithTimeout(void *s, int32_t ms) {
	NEED_CTX();
	if (!s) return fail(E_RT_PARAM, "fakeacl: sync of the default stream is not emulated");
	if (ms == 0 || ms < -1) return fail(E_RT_PARAM, "fakeacl: timeout %d: want -1 or > 0", ms);
	return wait_idle(s, ms);
}

static aclError enqueue_copy(void *dst, size_t dmax, const void *src, size_t n, int kind, void *st) {
	if (!st) return fail(E_RT_PARAM, "fakeacl: async copy on the default (NULL) stream is not emulated");
	int pageable;
	aclError rc = check_copy(dst, dmax, src, n, kind, &pageable);
	if (rc) return rc;
	if (pageable) {
		/* CANN: with pageable host memory the call returns after the copy. */
		rc = wait_idle(st, -1);
		if (rc) return rc;
		memmove(dst, src, n);
		__atomic_add_fetch(&n_sync_copies, 1, __ATOMIC_RELAXED);
		return OK;
	}
	struct task *t = calloc(1, sizeof *t);
	t->type = T_COPY;
	t->dst = dst;
	t->src = src;
	t->n = n;
	t->seq = __atomic_add_fetch(&n_copies, 1, __ATOMIC_RELAXED);
	if (kind == D2D) __atomic_add_fetch(&n_d2d, 1, __ATOMIC_RELAXED);
	push(st, t);
	return OK;
}

aclError aclrtMemcpyAsync(void *dst, size_t dmax, const void *src, size_t n, int kind, void *st) {
	NEED_CTX();
	return enqueue_copy(dst, dmax, src, n, kind, st);
}

#ifndef FAKEACL_NO_BATCH
typedef struct { uint32_t id; int32_t type; } loc_t;
typedef struct { loc_t dst, src; uint8_t rsv[16]; } attr_t;

aclError aclrtMemcpyBatchAsync(void **dsts, size_t *dmaxs, void **srcs, size_t *sizes, size_t count,
                               attr_t *attrs, size_t *idxs, size_t nattrs, size_t *failIdx, void *st) {
	NEED_CTX();
	__atomic_add_fetch(&n_batch, 1, __ATOMIC_RELAXED);
	if (failIdx) *failIdx = (size_t)-1;
	if (batch_unsupported) return fail(E_FEATURE, "fakeacl: aclrtMemcpyBatchAsync: not supported on this device (FAKEACL_BATCH_UNSUPPORTED)");
	if (!dsts || !dmaxs || !srcs || !sizes || !attrs || !idxs || !failIdx || count == 0 || nattrs == 0 || nattrs > count || idxs[0] != 0)
		return fail(E_RT_PARAM, "fakeacl: aclrtMemcpyBatchAsync: bad arrays (count %zu, numAttrs %zu)", count, nattrs);
	for (size_t a = 0; a < nattrs; a++) {
		if (a > 0 && idxs[a] <= idxs[a - 1]) return fail(E_RT_PARAM, "fakeacl: attrsIndexes not increasing");
		for (int i = 0; i < 16; i++)
			if (attrs[a].rsv[i]) return fail(E_RT_PARAM, "fakeacl: attr %zu: rsv must be 0", a);
		int h2d = attrs[a].src.type == 0 && attrs[a].dst.type == 1;
		int d2h = attrs[a].src.type == 1 && attrs[a].dst.type == 0;
		if (!h2d && !d2h) return fail(E_RT_PARAM, "fakeacl: attr %zu: only host->device or device->host (src type %d, dst type %d)", a, attrs[a].src.type, attrs[a].dst.type);
		if (a > 0 && attrs[a].src.type != attrs[0].src.type) return fail(E_RT_PARAM, "fakeacl: one direction per batch");
	}
	int kind = attrs[0].src.type == 1 ? D2H : H2D;
	for (size_t i = 0; i < count; i++) {
		int pageable;
		aclError rc = check_copy(dsts[i], dmaxs[i], srcs[i], sizes[i], kind, &pageable);
		if (rc) { *failIdx = i; return rc; }
	}
	for (size_t i = 0; i < count; i++) {
		aclError rc = enqueue_copy(dsts[i], dmaxs[i], srcs[i], sizes[i], kind, st);
		if (rc) { *failIdx = i; return rc; }
	}
	return OK;
}
#endif

/* ---- events ---- */

aclError aclrtCreateEventWithFlag(void **e, uint32_t flags) {
	NEED_CTX();
	if (flags == 0 || (flags & ~0x3bu)) return fail(E_RT_PARAM, "fakeacl: event flags %#x", flags);
	if ((flags & 0x20) && flags != 0x20) return fail(E_RT_PARAM, "fakeacl: ACL_EVENT_EXTERNAL goes alone");
	struct event *ev = calloc(1, sizeof *ev);
	ev->flags = flags;
	__atomic_add_fetch(&n_events, 1, __ATOMIC_RELAXED);
	*e = ev;
	return OK;
}

aclError aclrtDestroyEvent(void *e) {
	NEED_CTX();
	if (!e) return fail(E_RT_PARAM, "fakeacl: aclrtDestroyEvent(NULL)");
	free(e);
	__atomic_sub_fetch(&n_events, 1, __ATOMIC_RELAXED);
	return OK;
}

aclError aclrtRecordEvent(void *e, void *st) {
	NEED_CTX();
	if (!e || !st) return fail(E_RT_PARAM, "fakeacl: aclrtRecordEvent(%p, %p)", e, st);
	struct event *ev = e;
	struct task *t = calloc(1, sizeof *t);
	t->type = T_RECORD;
	t->ev = ev;
	t->gen = __atomic_add_fetch(&ev->recorded, 1, __ATOMIC_ACQ_REL);
	push(st, t);
	return OK;
}

static int complete(struct event *ev) {
	uint64_t r = __atomic_load_n(&ev->recorded, __ATOMIC_ACQUIRE);
	return r != 0 && __atomic_load_n(&ev->done, __ATOMIC_ACQUIRE) == r;
}

/* aclrtEventRecordedStatus: NOT_READY 0 (not recorded, not run yet, or
 * failed), COMPLETE 1. */
aclError aclrtQueryEventStatus(void *e, int32_t *status) {
	NEED_CTX();
	if (!e || !status) return fail(E_RT_PARAM, "fakeacl: aclrtQueryEventStatus(%p, %p)", e, (void *)status);
	*status = complete(e) ? 1 : 0;
	return OK;
}

/* The legacy call: aclrtEventStatus, COMPLETE 0, NOT_READY 1. stage must not
 * use it; fakeacl_legacy_queries counts calls so a test can say so. */
aclError aclrtQueryEvent(void *e, int32_t *status) {
	NEED_CTX();
	__atomic_add_fetch(&n_legacy_query, 1, __ATOMIC_RELAXED);
	*status = complete(e) ? 0 : 1;
	return OK;
}

/* ---- IPC: keys name the memfd as seen from another process ---- */

#ifndef FAKEACL_NO_IPC
aclError aclrtIpcMemGetExportKey(void *p, size_t n, char *key, size_t len, uint64_t flags) {
	NEED_CTX();
	if (len != 65 || !key) return fail(E_RT_PARAM, "fakeacl: export key buffer of %zu B, want 65", len);
	if (flags > 1) return fail(E_RT_PARAM, "fakeacl: export flags %llu", (unsigned long long)flags);
	pthread_mutex_lock(&mu);
	struct mem *m = find((uintptr_t)p, n, M_DEV);
	aclError rc = OK;
	if (!m) rc = fail(E_RT_PARAM, "fakeacl: export of %p+%zu: not inside one aclrtMalloc allocation", p, n);
	else if (((uintptr_t)p - m->p) % PAGE) rc = fail(E_RT_PARAM, "fakeacl: export of %p: not page-aligned inside its allocation (export the base, carry the offset)", p);
	else if (m->key[0]) rc = fail(E_RT_PARAM, "fakeacl: allocation %p already exported as %s", (void *)m->p, m->key);
	if (!rc) {
		snprintf(m->key, sizeof m->key, "fakeacl:%d:%d:%lx:%lx:%zx", (int)getpid(), heap_fd,
		         (unsigned long)((char *)m->meta - heap), (unsigned long)((uintptr_t)p - m->p), n);
		m->meta->no_validation = (uint32_t)flags;
		m->meta->npids = 0;
		__atomic_store_n(&m->meta->exported, 1, __ATOMIC_RELEASE);
		memcpy(key, m->key, 65);
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

static struct mem *find_key(const char *key, int kind) {
	for (struct mem *m = mems; m; m = m->next)
		if (m->kind == kind && strcmp(m->key, key) == 0) return m;
	return NULL;
}

aclError aclrtIpcMemSetImportPid(const char *key, int32_t *pids, size_t n) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = find_key(key, M_DEV);
	aclError rc = OK;
	if (!m) rc = fail(E_RT_PARAM, "fakeacl: aclrtIpcMemSetImportPid(%s): not a key this process exported", key);
	else rc = add_pids(m->meta->pids, &m->meta->npids, pids, n);
	pthread_mutex_unlock(&mu);
	return rc;
}

aclError aclrtIpcMemImportByKey(void **p, const char *key, uint64_t flags) {
	NEED_CTX();
	int pid, fd;
	unsigned long metaoff, off;
	size_t n;
	if (flags > 1) return fail(E_RT_PARAM, "fakeacl: import flags %llu", (unsigned long long)flags);
	if (!key || sscanf(key, "fakeacl:%d:%d:%lx:%lx:%zx", &pid, &fd, &metaoff, &off, &n) != 5 || metaoff % PAGE || off % PAGE)
		return fail(E_RT_PARAM, "fakeacl: %s is not a fakeacl key", key ? key : "(null)");
	pthread_mutex_lock(&mu);
	struct mem *dup = find_key(key, M_IMPORT);
	pthread_mutex_unlock(&mu);
	if (dup) return fail(E_RT_PARAM, "fakeacl: key %s is already imported in this process", key);
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
	int f = open(path, O_RDWR | O_CLOEXEC);
	if (f < 0) return fail(E_IPC, "fakeacl: key %s: open %s: %s (exporter gone?)", key, path, strerror(errno));
	struct meta *meta = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, f, (off_t)metaoff);
	if (meta == MAP_FAILED || meta->magic != MAGIC || meta->vmm || !__atomic_load_n(&meta->exported, __ATOMIC_ACQUIRE) || off + n > meta->size) {
		if (meta != MAP_FAILED) munmap(meta, PAGE);
		close(f);
		return fail(E_IPC, "fakeacl: key %s is not exported (closed, freed, or not a fakeacl allocation)", key);
	}
	if (!meta->no_validation) {
		if (!pid_listed(meta->pids, meta->npids, bare_tgid())) {
			munmap(meta, PAGE);
			close(f);
			return fail(E_NO_PERMISSION, "fakeacl: BareTgid %d is not on the import whitelist of key %s (aclrtIpcMemSetImportPid)", (int)bare_tgid(), key);
		}
	}
	void *a = mmap(NULL, up(n), PROT_READ | PROT_WRITE, MAP_SHARED, f, (off_t)(metaoff + PAGE + off));
	close(f);
	if (a == MAP_FAILED) {
		munmap(meta, PAGE);
		return fail(E_IPC, "fakeacl: key %s: mmap: %s", key, strerror(errno));
	}
	__atomic_add_fetch(&meta->importers, 1, __ATOMIC_ACQ_REL);
	struct mem *m = calloc(1, sizeof *m);
	m->kind = M_IMPORT;
	m->dev = meta->dev;
	m->p = (uintptr_t)a;
	m->n = n;
	m->maplen = up(n);
	m->meta = meta;
	snprintf(m->key, sizeof m->key, "%s", key);
	pthread_mutex_lock(&mu);
	add(m);
	pthread_mutex_unlock(&mu);
	*p = a;
	return OK;
}

aclError aclrtIpcMemClose(const char *key) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = find_key(key, M_IMPORT);
	if (m) { /* importer side */
		drop(m);
		pthread_mutex_unlock(&mu);
		munmap((void *)m->p, m->maplen);
		__atomic_sub_fetch(&m->meta->importers, 1, __ATOMIC_ACQ_REL);
		munmap(m->meta, PAGE);
		free(m);
		return OK;
	}
	m = find_key(key, M_DEV);
	aclError rc = OK;
	if (!m) rc = fail(E_RT_PARAM, "fakeacl: aclrtIpcMemClose(%s): unknown key", key);
	else if (__atomic_load_n(&m->meta->importers, __ATOMIC_ACQUIRE) > 0)
		rc = fail(E_IPC, "fakeacl: aclrtIpcMemClose(%s): still imported by %d process(es); importers close first", key, m->meta->importers);
	else {
		__atomic_store_n(&m->meta->exported, 0, __ATOMIC_RELEASE);
		m->key[0] = 0;
	}
	pthread_mutex_unlock(&mu);
	return rc;
}
#endif

/* ---- virtual memory: physical chunks, reservations, mappings ---- */

#ifndef FAKEACL_NO_VMM


static struct mem *find_phys(void *h) {
	for (struct mem *m = mems; m; m = m->next)
		if (m == h && (m->kind == M_PHYS || m->kind == M_PIMPORT)) return m;
	return NULL;
}

static struct mem *find_kind_at(uintptr_t p, int kind) {
	for (struct mem *m = mems; m; m = m->next)
		if (m->kind == kind && m->p == p) return m;
	return NULL;
}

/* phys_put drops one owner of chunk m (mu held); the last owner with no
 * mapping left frees it. Returns 1 when m was freed. */
static int phys_put(struct mem *m) {
	if (--m->refs > 0 || m->maps > 0) return 0;
	drop(m);
	if (m->kind == M_PIMPORT) {
		__atomic_sub_fetch(&m->meta->importers, 1, __ATOMIC_ACQ_REL);
		munmap(m->meta, PAGE);
		close(m->fd);
	} else {
		__atomic_store_n(&m->meta->exported, 0, __ATOMIC_RELEASE);
		/* Importers may still map the pages: punch them out only when none does. */
		if (__atomic_load_n(&m->meta->importers, __ATOMIC_ACQUIRE) == 0)
			fallocate(heap_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, m->off - (off_t)PAGE, (off_t)(PAGE + m->n));
	}
	free(m);
	return 1;
}

aclError aclrtMemGetAllocationGranularity(physprop_t *prop, int option, size_t *g) {
	if (!prop || !g) return fail(E_RT_PARAM, "fakeacl: aclrtMemGetAllocationGranularity: NULL argument");
	if (option != 0 && option != 1) return fail(E_RT_PARAM, "fakeacl: aclrtMemGetAllocationGranularity: option %d", option);
	*g = granularity;
	return OK;
}

aclError aclrtMallocPhysical(void **handle, size_t size, const physprop_t *prop, uint64_t flags) {
	NEED_CTX();
	if (!handle || !prop) return fail(E_RT_PARAM, "fakeacl: aclrtMallocPhysical: NULL handle or prop");
	if (flags != 0) return fail(E_RT_PARAM, "fakeacl: aclrtMallocPhysical: flags %llu, want 0", (unsigned long long)flags);
	if (prop->loc_type != 1 || prop->loc_id >= (uint32_t)ndev)
		return fail(E_RT_PARAM, "fakeacl: aclrtMallocPhysical: location {id %u, type %d}, want a device (type 1) of %d", prop->loc_id, prop->loc_type, ndev);
	if (prop->allocationType != 0) return fail(E_RT_PARAM, "fakeacl: aclrtMallocPhysical: allocationType %d, want PINNED (0)", prop->allocationType);
	if (size == 0 || size % granularity)
		return fail(E_RT_PARAM, "fakeacl: aclrtMallocPhysical(%zu B): not a multiple of the granularity %zu", size, granularity);
	pthread_mutex_lock(&mu);
	if (size > HEAP_SIZE || heap_top + PAGE + size > HEAP_SIZE) {
		pthread_mutex_unlock(&mu);
		return fail(E_MEM_ALLOC, "fakeacl: aclrtMallocPhysical(%zu B): out of device memory", size);
	}
	struct mem *m = calloc(1, sizeof *m);
	m->kind = M_PHYS;
	m->meta = (struct meta *)(heap + heap_top);
	m->fd = heap_fd;
	m->off = (off_t)(heap_top + PAGE);
	m->n = size;
	m->refs = 1;
	m->dev = phys_of[prop->loc_id];
	heap_top += PAGE + size;
	m->meta->magic = MAGIC;
	m->meta->size = size;
	m->meta->dev = m->dev;
	m->meta->vmm = 1;
	add(m);
	pthread_mutex_unlock(&mu);
	*handle = m;
	return OK;
}

aclError aclrtFreePhysical(void *handle) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = find_phys(handle);
	if (!m) {
		pthread_mutex_unlock(&mu);
		return fail(E_RT_PARAM, "fakeacl: aclrtFreePhysical(%p): not a physical memory handle", handle);
	}
	if (m->refs <= 0) {
		pthread_mutex_unlock(&mu);
		return fail(E_RT_PARAM, "fakeacl: aclrtFreePhysical(%p): already freed (still mapped)", handle);
	}
	phys_put(m);
	pthread_mutex_unlock(&mu);
	return OK;
}

aclError aclrtMemGetAllocationPropertiesFromHandle(void *handle, physprop_t *prop) {
	NEED_CTX();
	if (!prop) return fail(E_RT_PARAM, "fakeacl: aclrtMemGetAllocationPropertiesFromHandle: NULL prop");
	pthread_mutex_lock(&mu);
	struct mem *m = find_phys(handle);
	if (m) {
		memset(prop, 0, sizeof *prop);
		prop->memAttr = 4; /* ACL_HBM_MEM_HUGE */
		prop->loc_type = 1;
		prop->loc_id = 0;
		for (int i = 0; i < ndev; i++)
			if (phys_of[i] == m->dev) prop->loc_id = (uint32_t)i;
	}
	pthread_mutex_unlock(&mu);
	return m ? OK : fail(E_RT_PARAM, "fakeacl: aclrtMemGetAllocationPropertiesFromHandle(%p): not a physical memory handle", handle);
}

aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags) {
	NEED_CTX();
	if (!virPtr || size == 0) return fail(E_RT_PARAM, "fakeacl: aclrtReserveMemAddress: NULL virPtr or size 0");
	if (alignment != 0) return fail(E_RT_PARAM, "fakeacl: aclrtReserveMemAddress: alignment %zu is reserved, must be 0", alignment);
	if (expectPtr) return fail(E_FEATURE, "fakeacl: aclrtReserveMemAddress: a requested address (%p) is not emulated; pass NULL", expectPtr);
	if (flags > 1) return fail(E_RT_PARAM, "fakeacl: aclrtReserveMemAddress: flags %llu", (unsigned long long)flags);
	/* Aligned to the granularity, as the runtime's reservations are. */
	size_t len = up(size);
	void *a = mmap(NULL, len + granularity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (a == MAP_FAILED) return fail(E_MEM_ALLOC, "fakeacl: aclrtReserveMemAddress(%zu B): %s", size, strerror(errno));
	uintptr_t start = ((uintptr_t)a + granularity - 1) / granularity * granularity;
	if (start > (uintptr_t)a) munmap(a, start - (uintptr_t)a);
	uintptr_t tail = start + len, end = (uintptr_t)a + len + granularity;
	if (end > tail) munmap((void *)tail, end - tail);
	struct mem *m = calloc(1, sizeof *m);
	m->kind = M_RESERVE;
	m->p = start;
	m->n = len;
	pthread_mutex_lock(&mu);
	add(m);
	pthread_mutex_unlock(&mu);
	*virPtr = (void *)start;
	return OK;
}

aclError aclrtReleaseMemAddress(void *virPtr) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *r = find_kind_at((uintptr_t)virPtr, M_RESERVE);
	aclError rc = OK;
	if (!r) rc = fail(E_RT_PARAM, "fakeacl: aclrtReleaseMemAddress(%p): not the start of a reservation", virPtr);
	else
		for (struct mem *m = mems; m && !rc; m = m->next)
			if (m->kind == M_MAPPED && m->p >= r->p && m->p - r->p < r->n)
				rc = fail(E_RT_PARAM, "fakeacl: aclrtReleaseMemAddress(%p): %p is still mapped (aclrtUnmapMem first)", virPtr, (void *)m->p);
	if (!rc) drop(r);
	pthread_mutex_unlock(&mu);
	if (rc) return rc;
	munmap((void *)r->p, r->n);
	free(r);
	return OK;
}

aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, void *handle, uint64_t flags) {
	NEED_CTX();
	uintptr_t p = (uintptr_t)virPtr;
	if (offset != 0) return fail(E_RT_PARAM, "fakeacl: aclrtMapMem: offset %zu is reserved, must be 0", offset);
	if (flags != 0) return fail(E_RT_PARAM, "fakeacl: aclrtMapMem: flags %llu is reserved, must be 0", (unsigned long long)flags);
	pthread_mutex_lock(&mu);
	struct mem *ph = find_phys(handle), *r = NULL;
	for (struct mem *m = mems; m; m = m->next)
		if (m->kind == M_RESERVE && p >= m->p && p - m->p < m->n) r = m;
	aclError rc = OK;
	if (!ph) rc = fail(E_RT_PARAM, "fakeacl: aclrtMapMem(%p): handle %p is not a physical memory handle", virPtr, handle);
	else if (size != ph->n) rc = fail(E_RT_PARAM, "fakeacl: aclrtMapMem(%p, %zu B): the size must equal the physical allocation's (%zu B)", virPtr, size, ph->n);
	else if (!r || size > r->n - (p - r->p)) rc = fail(E_RT_PARAM, "fakeacl: aclrtMapMem(%p, %zu B): not inside one aclrtReserveMemAddress range", virPtr, size);
	else if ((p - r->p) % granularity) rc = fail(E_RT_PARAM, "fakeacl: aclrtMapMem(%p): not granularity-aligned (%zu) in its reservation", virPtr, granularity);
	else if (r->bound && (r->bound != ph->kind || r->bound_dev != ph->dev))
		rc = fail(E_RT_PARAM, "fakeacl: aclrtMapMem(%p): its reservation already maps %s memory of device %d; it cannot also map %s memory of device %d",
		          virPtr, r->bound == M_PHYS ? "allocated" : "imported", r->bound_dev, ph->kind == M_PHYS ? "allocated" : "imported", ph->dev);
	else
		for (struct mem *m = mems; m && !rc; m = m->next)
			if (m->kind == M_MAPPED && p < m->p + m->n && m->p < p + size)
				rc = fail(E_RT_PARAM, "fakeacl: aclrtMapMem(%p, %zu B): overlaps the mapping at %p", virPtr, size, (void *)m->p);
	if (!rc) {
		void *a = mmap(virPtr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, ph->fd, ph->off);
		if (a == MAP_FAILED) rc = fail(E_MEM_ALLOC, "fakeacl: aclrtMapMem(%p): mmap: %s", virPtr, strerror(errno));
	}
	if (!rc) {
		struct mem *m = calloc(1, sizeof *m);
		m->kind = M_MAPPED;
		m->p = p;
		m->n = size;
		m->phys = ph;
		m->dev = ph->dev;
		/* Local chunks are usable at once; imported ones only after aclrtMemSetAccess. */
		m->access = ph->kind == M_PHYS ? ACCESS_READWRITE : ACCESS_NONE;
		if (m->access == ACCESS_NONE) mprotect(virPtr, size, PROT_NONE);
		ph->maps++;
		r->bound = ph->kind;
		r->bound_dev = ph->dev;
		add(m);
		__atomic_add_fetch(&n_vmm_maps, 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

aclError aclrtUnmapMem(void *virPtr) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct mem *m = find_kind_at((uintptr_t)virPtr, M_MAPPED);
	if (!m) {
		pthread_mutex_unlock(&mu);
		return fail(E_RT_PARAM, "fakeacl: aclrtUnmapMem(%p): not the start of a mapping", virPtr);
	}
	drop(m);
	/* Back to reserved and inaccessible. */
	mmap(virPtr, m->n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	struct mem *ph = m->phys;
	ph->maps--;
	ph->refs++; /* phys_put drops it again and frees a chunk nobody owns */
	phys_put(ph);
	pthread_mutex_unlock(&mu);
	free(m);
	__atomic_sub_fetch(&n_vmm_maps, 1, __ATOMIC_RELAXED);
	return OK;
}

aclError aclrtMemSetAccess(void *virPtr, size_t size, accessdesc_t *desc, size_t count) {
	NEED_CTX();
	if (!desc || count == 0) return fail(E_RT_PARAM, "fakeacl: aclrtMemSetAccess: no descriptor");
	int flags = -1;
	for (size_t i = 0; i < count; i++) {
		if (desc[i].flags != ACCESS_NONE && desc[i].flags != ACCESS_READ && desc[i].flags != ACCESS_READWRITE)
			return fail(E_RT_PARAM, "fakeacl: aclrtMemSetAccess: desc %zu flags %d", i, desc[i].flags);
		if (desc[i].loc_type != 0 && desc[i].loc_type != 1)
			return fail(E_RT_PARAM, "fakeacl: aclrtMemSetAccess: desc %zu location type %d, want HOST (0) or DEVICE (1)", i, desc[i].loc_type);
		for (int j = 0; j < 12; j++)
			if (desc[i].rsv[j]) return fail(E_RT_PARAM, "fakeacl: aclrtMemSetAccess: desc %zu rsv must be 0", i);
		if (desc[i].loc_type == 1 && desc[i].loc_id == (uint32_t)cur->dev) flags = desc[i].flags;
	}
	pthread_mutex_lock(&mu);
	struct mem *m = find_kind_at((uintptr_t)virPtr, M_MAPPED);
	aclError rc = OK;
	if (!m || m->n != size) rc = fail(E_RT_PARAM, "fakeacl: aclrtMemSetAccess(%p, %zu B): want the address and size of one aclrtMapMem", virPtr, size);
	else if (flags >= 0) {
		m->access = flags;
		mprotect(virPtr, size, flags == ACCESS_READWRITE ? PROT_READ | PROT_WRITE : flags == ACCESS_READ ? PROT_READ : PROT_NONE);
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

aclError aclrtMemRetainAllocationHandle(void *virPtr, void **handle) {
	NEED_CTX();
	if (!handle) return fail(E_RT_PARAM, "fakeacl: aclrtMemRetainAllocationHandle: NULL handle");
	pthread_mutex_lock(&mu);
	struct mem *m = find_kind_at((uintptr_t)virPtr, M_MAPPED);
	if (m) {
		m->phys->refs++;
		*handle = m->phys;
	}
	pthread_mutex_unlock(&mu);
	return m ? OK : fail(E_RT_PARAM, "fakeacl: aclrtMemRetainAllocationHandle(%p): not the start of an aclrtMapMem mapping", virPtr);
}

aclError aclrtMemExportToShareableHandle(void *handle, int handleType, uint64_t flags, uint64_t *shareable) {
	NEED_CTX();
	if (!shareable) return fail(E_RT_PARAM, "fakeacl: aclrtMemExportToShareableHandle: NULL shareableHandle");
	if (handleType != 0) return fail(E_RT_PARAM, "fakeacl: aclrtMemExportToShareableHandle: handleType %d is reserved, must be ACL_MEM_HANDLE_TYPE_NONE (0)", handleType);
	if (flags > 1) return fail(E_RT_PARAM, "fakeacl: aclrtMemExportToShareableHandle: flags %llu", (unsigned long long)flags);
	pthread_mutex_lock(&mu);
	struct mem *m = find_phys(handle);
	aclError rc = OK;
	if (!m) rc = fail(E_RT_PARAM, "fakeacl: aclrtMemExportToShareableHandle(%p): not a physical memory handle", handle);
	else if (m->kind == M_PIMPORT) rc = fail(E_RT_PARAM, "fakeacl: aclrtMemExportToShareableHandle(%p): an imported handle cannot be exported again", handle);
	else if (m->shareable) rc = fail(E_RT_PARAM, "fakeacl: aclrtMemExportToShareableHandle(%p): already exported as %#llx (one shareable handle per handle)", handle, (unsigned long long)m->shareable);
	else {
		m->shareable = ((uint64_t)(uint32_t)getpid() << 40) | ((uint64_t)(uint32_t)heap_fd << 24) | (uint64_t)((m->off - (off_t)PAGE) / (off_t)PAGE);
		m->meta->no_validation = (uint32_t)flags;
		m->meta->npids = 0;
		__atomic_store_n(&m->meta->exported, 1, __ATOMIC_RELEASE);
		*shareable = m->shareable;
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

aclError aclrtMemSetPidToShareableHandle(uint64_t shareable, int32_t *pids, size_t n) {
	NEED_CTX();
	if (!pids || n == 0) return fail(E_RT_PARAM, "fakeacl: aclrtMemSetPidToShareableHandle: no pid");
	pthread_mutex_lock(&mu);
	struct mem *m = NULL;
	for (struct mem *x = mems; x; x = x->next)
		if (x->kind == M_PHYS && x->shareable == shareable) m = x;
	aclError rc = OK;
	if (!m) rc = fail(E_RT_PARAM, "fakeacl: aclrtMemSetPidToShareableHandle(%#llx): not a handle this process exported", (unsigned long long)shareable);
	else rc = add_pids(m->meta->pids, &m->meta->npids, pids, n);
	pthread_mutex_unlock(&mu);
	return rc;
}

aclError aclrtMemImportFromShareableHandle(uint64_t shareable, int32_t deviceId, void **handle) {
	NEED_CTX();
	if (!handle) return fail(E_RT_PARAM, "fakeacl: aclrtMemImportFromShareableHandle: NULL handle");
	if (deviceId < 0 || deviceId >= ndev) return fail(E_RT_DEVICE, "fakeacl: aclrtMemImportFromShareableHandle: device %d of %d", deviceId, ndev);
	int pid = (int)(shareable >> 40), hfd = (int)((shareable >> 24) & 0xffff);
	off_t metaoff = (off_t)(shareable & 0xffffff) * (off_t)PAGE;
	if (pid == getpid()) return fail(E_RT_PARAM, "fakeacl: aclrtMemImportFromShareableHandle(%#llx): exported by this process; export and import must be different processes", (unsigned long long)shareable);
	pthread_mutex_lock(&mu);
	struct mem *dup = NULL;
	for (struct mem *x = mems; x; x = x->next)
		if (x->kind == M_PIMPORT && x->shareable == shareable) dup = x;
	pthread_mutex_unlock(&mu);
	if (dup) return fail(E_RT_PARAM, "fakeacl: aclrtMemImportFromShareableHandle(%#llx): already imported in this process (one handle per shareable handle)", (unsigned long long)shareable);
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, hfd);
	int f = open(path, O_RDWR | O_CLOEXEC);
	if (f < 0) return fail(E_IPC, "fakeacl: aclrtMemImportFromShareableHandle(%#llx): open %s: %s (exporter gone?)", (unsigned long long)shareable, path, strerror(errno));
	struct meta *meta = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, f, metaoff);
	if (meta == MAP_FAILED || meta->magic != MAGIC || !meta->vmm || !__atomic_load_n(&meta->exported, __ATOMIC_ACQUIRE)) {
		if (meta != MAP_FAILED) munmap(meta, PAGE);
		close(f);
		return fail(E_IPC, "fakeacl: aclrtMemImportFromShareableHandle(%#llx): not an exported physical allocation (freed, or not exported)", (unsigned long long)shareable);
	}
	if (!meta->no_validation) {
		if (!pid_listed(meta->pids, meta->npids, bare_tgid())) {
			munmap(meta, PAGE);
			close(f);
			return fail(E_NO_PERMISSION, "fakeacl: aclrtMemImportFromShareableHandle(%#llx): BareTgid %d is not on the whitelist (aclrtMemSetPidToShareableHandle)", (unsigned long long)shareable, (int)bare_tgid());
		}
	}
	__atomic_add_fetch(&meta->importers, 1, __ATOMIC_ACQ_REL);
	struct mem *m = calloc(1, sizeof *m);
	m->kind = M_PIMPORT;
	m->meta = meta;
	m->fd = f;
	m->off = metaoff + (off_t)PAGE;
	m->n = meta->size;
	m->refs = 1;
	m->dev = meta->dev;
	m->shareable = shareable;
	pthread_mutex_lock(&mu);
	add(m);
	pthread_mutex_unlock(&mu);
	*handle = m;
	return OK;
}

#endif /* FAKEACL_NO_VMM */

/* ---- test hooks ---- */

long fakeacl_live(void) {
	pthread_mutex_lock(&mu);
	long n = 0;
	for (struct mem *m = mems; m; m = m->next) n++;
	for (int i = 0; i < 8; i++) n += ctxs[i].refs;
	pthread_mutex_unlock(&mu);
	return n + __atomic_load_n(&n_streams, __ATOMIC_RELAXED) + __atomic_load_n(&n_events, __ATOMIC_RELAXED);
}

long fakeacl_pause(void) {
	pthread_mutex_lock(&pause_mu);
	paused = 1;
	pthread_mutex_unlock(&pause_mu);
	return 0;
}

long fakeacl_resume(void) {
	pthread_mutex_lock(&pause_mu);
	paused = 0;
	pthread_cond_broadcast(&pause_cv);
	pthread_mutex_unlock(&pause_mu);
	return 0;
}

long fakeacl_init_calls(void) { return n_init; }
long fakeacl_setdevice_calls(void) { return n_setdevice; }
long fakeacl_device_refs(void) { return ctxs[0].refs; }
long fakeacl_ctx_sets(void) { return n_ctx_sets; }
long fakeacl_copies(void) { return n_copies; }
long fakeacl_d2d_copies(void) { return n_d2d; }
long fakeacl_sync_copies(void) { return n_sync_copies; }
long fakeacl_batch_calls(void) { return n_batch; }
long fakeacl_legacy_queries(void) { return n_legacy_query; }
long fakeacl_stream_config_calls(void) { return n_stream_config; }
long fakeacl_vmm_maps(void) { return n_vmm_maps; }
