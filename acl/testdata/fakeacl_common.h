/* fakeacl_common.h: what the two emulations of libascendcl share,
 * fakeacl.c (over host memory) and fakeacl_cuda.c (over CUDA): the
 * aclError codes, the per-thread error message, the contexts bound per OS
 * thread, BareTgid, the VMM calls' argument types and the pid whitelists.
 *
 * Each includes it once, after defining
 *   FAKE_NAME      its name in error messages ("fakeacl", "fakeacl_cuda")
 *   FAKE_NCTX      how many device contexts it keeps
 *   FAKE_BIND(d)   an aclError expression binding this thread to device d
 *                  (OK where nothing needs binding)
 * Everything here is static: the header is part of one translation unit. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef int aclError;

enum {
	OK = 0,
	E_INVALID_PARAM = 100000,
	E_REPEAT_INIT = 100002,
	E_RT_PARAM = 107000,
	E_RT_DEVICE = 107001,
	E_RT_CONTEXT_NULL = 107002,
	E_RT_HANDLE = 107017,
	E_FEATURE = 207000,
	E_MEM_ALLOC = 207001,
	E_NOT_PERMITTED = 207003,
	E_NO_PERMISSION = 207006,
	E_SYS_DMA = 507013,
	E_IPC = 507022,
	E_STREAM_TIMEOUT = 507046,
	E_DRV = 507899,
	E_ALREADY_REGISTERED = 507910,
	E_NOT_REGISTERED = 507911,
};

#define PAGE 4096UL
#define MAX_PIDS 64 /* whitelisted pids per export key or shareable handle */

/* ---- errors: per thread, cleared when read ---- */

static __thread char errmsg[512], errout[512];

static aclError fail(aclError rc, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errmsg, sizeof errmsg, fmt, ap);
	va_end(ap);
	return rc;
}

const char *aclGetRecentErrMsg(void) {
	if (!errmsg[0]) return NULL;
	memcpy(errout, errmsg, sizeof errout);
	errmsg[0] = 0;
	return errout;
}

static inline long envl(const char *k, long def) {
	const char *v = getenv(k);
	return v && *v ? atol(v) : def;
}

/* ---- contexts, bound per OS thread ---- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long n_setdevice, n_ctx_sets;

struct ctx { int dev; int refs; };
static struct ctx ctxs[FAKE_NCTX];
static __thread struct ctx *cur;

#define NEED_CTX() do { \
	if (!cur || __atomic_load_n(&cur->refs, __ATOMIC_ACQUIRE) <= 0) \
		return fail(E_RT_CONTEXT_NULL, FAKE_NAME ": %s: no current context on this thread (aclrtSetDevice or aclrtSetCurrentContext first)", __func__); \
} while (0)

aclError aclrtGetCurrentContext(void **c) {
	if (!cur) return fail(E_RT_CONTEXT_NULL, FAKE_NAME ": no context on this thread");
	*c = cur;
	return OK;
}

aclError aclrtSetCurrentContext(void *c) {
	struct ctx *x = c;
	if (x < ctxs || x >= ctxs + FAKE_NCTX || __atomic_load_n(&x->refs, __ATOMIC_ACQUIRE) <= 0)
		return fail(E_RT_HANDLE, FAKE_NAME ": aclrtSetCurrentContext(%p): no such live context", c);
	aclError rc = FAKE_BIND(x->dev);
	if (rc) return rc;
	cur = x;
	__atomic_add_fetch(&n_ctx_sets, 1, __ATOMIC_RELAXED);
	return OK;
}

/* bare_tgid: this process as the driver names it (FAKEACL_TGID_OFFSET
 * emulates a pid namespace, where it is not getpid()). */
static inline int32_t bare_tgid(void) { return (int32_t)(getpid() + envl("FAKEACL_TGID_OFFSET", 0)); }

#ifndef FAKEACL_NO_BARE_TGID
aclError aclrtDeviceGetBareTgid(int32_t *pid) {
	if (!pid) return fail(E_RT_PARAM, FAKE_NAME ": aclrtDeviceGetBareTgid(NULL)");
	*pid = bare_tgid();
	return OK;
}
#endif

/* ---- pid whitelists ---- */

/* add_pids appends pids[0:n] to the whitelist list of *npids entries (mu
 * held), refusing to hold more than MAX_PIDS. */
static inline aclError add_pids(int32_t *list, uint32_t *npids, const int32_t *pids, size_t n) {
	if (*npids + n > MAX_PIDS) return fail(E_RT_PARAM, FAKE_NAME ": more than %d whitelisted pids", MAX_PIDS);
	for (size_t i = 0; i < n; i++) list[(*npids)++] = pids[i];
	return OK;
}

/* pid_listed reports whether pid is among the npids entries of list. */
static inline int pid_listed(const int32_t *list, uint32_t npids, int32_t pid) {
	for (uint32_t i = 0; i < npids && i < MAX_PIDS; i++)
		if (list[i] == pid) return 1;
	return 0;
}

/* ---- virtual memory: the argument types ---- */

/* aclrtPhysicalMemProp: {handleType, allocationType, memAttr, location
 * {u32 id; type}, u64 reserve}, 32 bytes. aclrtMemAccessDesc: {flags,
 * location, u8 rsv[12]}, 24 bytes. */
typedef struct { int32_t handleType, allocationType, memAttr; uint32_t loc_id; int32_t loc_type; uint64_t reserve; } physprop_t;
typedef struct { int32_t flags; uint32_t loc_id; int32_t loc_type; uint8_t rsv[12]; } accessdesc_t;

enum { ACCESS_NONE = 0, ACCESS_READ = 1, ACCESS_READWRITE = 3 };
