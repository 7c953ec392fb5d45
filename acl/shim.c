/* shim.c: symbol table and trampolines of the acl backend (see shim.h). */
#include "shim.h"

#include <stdlib.h>
#include <string.h>

#define SYM(name, group) { #name, group, offsetof(stacl_acl, name) }

static const struct {
	const char *name;
	int group;
	size_t off;
} stacl_syms[] = {
	SYM(aclInit, STACL_SYM_REQUIRED),
	SYM(aclGetRecentErrMsg, STACL_SYM_REQUIRED),
	SYM(aclrtGetDeviceCount, STACL_SYM_REQUIRED),
	SYM(aclrtSetDevice, STACL_SYM_REQUIRED),
	SYM(aclrtResetDevice, STACL_SYM_REQUIRED),
	SYM(aclrtGetCurrentContext, STACL_SYM_REQUIRED),
	SYM(aclrtSetCurrentContext, STACL_SYM_REQUIRED),
	SYM(aclrtMalloc, STACL_SYM_REQUIRED),
	SYM(aclrtFree, STACL_SYM_REQUIRED),
	SYM(aclrtMallocHost, STACL_SYM_REQUIRED),
	SYM(aclrtFreeHost, STACL_SYM_REQUIRED),
	SYM(aclrtHostRegister, STACL_SYM_REQUIRED),
	SYM(aclrtHostUnregister, STACL_SYM_REQUIRED),
	SYM(aclrtMemcpy, STACL_SYM_REQUIRED),
	SYM(aclrtMemcpyAsync, STACL_SYM_REQUIRED),
	SYM(aclrtCreateStream, STACL_SYM_REQUIRED),
	SYM(aclrtDestroyStream, STACL_SYM_REQUIRED),
	SYM(aclrtSynchronizeStreamWithTimeout, STACL_SYM_REQUIRED),
	SYM(aclrtCreateEventWithFlag, STACL_SYM_REQUIRED),
	SYM(aclrtRecordEvent, STACL_SYM_REQUIRED),
	SYM(aclrtQueryEventStatus, STACL_SYM_REQUIRED),
	SYM(aclrtDestroyEvent, STACL_SYM_REQUIRED),
	SYM(aclrtCreateStreamWithConfig, STACL_SYM_EXTRA),
	SYM(aclrtMemcpyBatchAsync, STACL_SYM_BATCH),
	SYM(aclrtIpcMemGetExportKey, STACL_SYM_IPC),
	SYM(aclrtIpcMemSetImportPid, STACL_SYM_IPC),
	SYM(aclrtIpcMemImportByKey, STACL_SYM_IPC),
	SYM(aclrtIpcMemClose, STACL_SYM_IPC),
	SYM(aclrtDeviceGetBareTgid, STACL_SYM_EXTRA),
	SYM(aclrtMemGetAddressRange, STACL_SYM_EXTRA),
	SYM(aclrtGetPhyDevIdByLogicDevId, STACL_SYM_EXTRA),
	SYM(aclrtMemImportFromShareableHandle, STACL_SYM_VMM),
	SYM(aclrtReserveMemAddress, STACL_SYM_VMM),
	SYM(aclrtReleaseMemAddress, STACL_SYM_VMM),
	SYM(aclrtMapMem, STACL_SYM_VMM),
	SYM(aclrtUnmapMem, STACL_SYM_VMM),
	SYM(aclrtMemSetAccess, STACL_SYM_VMM),
	SYM(aclrtFreePhysical, STACL_SYM_VMM),
	SYM(aclrtMallocPhysical, STACL_SYM_VMM_EXPORT),
	SYM(aclrtMemGetAllocationGranularity, STACL_SYM_VMM_EXPORT),
	SYM(aclrtMemRetainAllocationHandle, STACL_SYM_VMM_EXPORT),
	SYM(aclrtMemExportToShareableHandle, STACL_SYM_VMM_EXPORT),
	SYM(aclrtMemSetPidToShareableHandle, STACL_SYM_VMM_EXPORT),
};

_Static_assert(sizeof(aclrtMemLocation) == 8, "aclrtMemLocation is 8 bytes");
_Static_assert(sizeof(aclrtMemcpyBatchAttr) == 32, "aclrtMemcpyBatchAttr is 32 bytes");

int stacl_nsyms(void) { return (int)(sizeof stacl_syms / sizeof stacl_syms[0]); }
const char *stacl_sym_name(int i) { return stacl_syms[i].name; }
int stacl_sym_group(int i) { return stacl_syms[i].group; }
void stacl_sym_set(stacl_acl *l, int i, void *fp) { memcpy((char *)l + stacl_syms[i].off, &fp, sizeof fp); }
stacl_acl *stacl_acl_new(void) { return (stacl_acl *)calloc(1, sizeof(stacl_acl)); }
void stacl_acl_free(stacl_acl *l) { free(l); }

/* ret packs rc with this thread's error text: aclGetRecentErrMsg reads (and
 * clears) the calling thread's last failure, so it is read here, in the same
 * C call as the failure. */
static stacl_ret ret(const stacl_acl *l, aclError rc) {
	stacl_ret r = { rc, 0 };
	if (rc != 0) {
		const char *m = l->aclGetRecentErrMsg();
		if (m && *m) r.msg = strdup(m);
	}
	return r;
}

/* Makes ctx current on this OS thread unless it already is. Not
 * aclrtSetDevice: that one is reference counted (each call must be paired
 * with aclrtResetDevice), so calling it per operation would pile up
 * references. aclrtGetCurrentContext reads thread-local state. */
static aclError stacl_ctx(const stacl_acl *l, aclrtContext ctx) {
	aclrtContext cur = 0;
	if (l->aclrtGetCurrentContext(&cur) == 0 && cur == ctx) return 0;
	return l->aclrtSetCurrentContext(ctx);
}

#define CTX() do { aclError r_ = stacl_ctx(l, ctx); if (r_) return ret(l, r_); } while (0)

stacl_ret stacl_init(const stacl_acl *l) { return ret(l, l->aclInit(NULL)); }
stacl_ret stacl_device_count(const stacl_acl *l, uint32_t *n) { return ret(l, l->aclrtGetDeviceCount(n)); }

stacl_ret stacl_set_device(const stacl_acl *l, int32_t dev, aclrtContext *ctx) {
	aclError rc = l->aclrtSetDevice(dev);
	if (rc) return ret(l, rc);
	rc = l->aclrtGetCurrentContext(ctx);
	if (rc) {
		stacl_ret r = ret(l, rc);
		l->aclrtResetDevice(dev);
		return r;
	}
	return ret(l, 0);
}

stacl_ret stacl_reset_device(const stacl_acl *l, int32_t dev) { return ret(l, l->aclrtResetDevice(dev)); }
stacl_ret stacl_bare_tgid(const stacl_acl *l, int32_t *pid) { return ret(l, l->aclrtDeviceGetBareTgid(pid)); }
stacl_ret stacl_phys_dev(const stacl_acl *l, int32_t logic, int32_t *phys) { return ret(l, l->aclrtGetPhyDevIdByLogicDevId(logic, phys)); }

stacl_ret stacl_malloc(const stacl_acl *l, aclrtContext ctx, size_t n, int policy, uintptr_t *p) {
	CTX();
	void *q = 0;
	aclError rc = l->aclrtMalloc(&q, n, policy);
	if (rc == 0) *p = (uintptr_t)q;
	return ret(l, rc);
}

stacl_ret stacl_free(const stacl_acl *l, aclrtContext ctx, uintptr_t p) { CTX(); return ret(l, l->aclrtFree((void *)p)); }

stacl_ret stacl_malloc_host(const stacl_acl *l, aclrtContext ctx, size_t n, void **p) {
	CTX();
	return ret(l, l->aclrtMallocHost(p, n));
}

stacl_ret stacl_free_host(const stacl_acl *l, aclrtContext ctx, void *p) { CTX(); return ret(l, l->aclrtFreeHost(p)); }

stacl_ret stacl_host_register(const stacl_acl *l, aclrtContext ctx, void *p, size_t n, uintptr_t *dev) {
	CTX();
	void *d = 0;
	aclError rc = l->aclrtHostRegister(p, (uint64_t)n, 0 /* ACL_HOST_REGISTER_MAPPED */, &d);
	if (rc == 0) *dev = (uintptr_t)d;
	return ret(l, rc);
}

stacl_ret stacl_host_unregister(const stacl_acl *l, aclrtContext ctx, void *p) { CTX(); return ret(l, l->aclrtHostUnregister(p)); }

stacl_ret stacl_copy_h2d(const stacl_acl *l, aclrtContext ctx, uintptr_t dst, const void *src, size_t n) {
	CTX();
	return ret(l, l->aclrtMemcpy((void *)dst, n, src, n, 1 /* ACL_MEMCPY_HOST_TO_DEVICE */));
}

stacl_ret stacl_copy_d2h(const stacl_acl *l, aclrtContext ctx, void *dst, uintptr_t src, size_t n) {
	CTX();
	return ret(l, l->aclrtMemcpy(dst, n, (const void *)src, n, 2 /* ACL_MEMCPY_DEVICE_TO_HOST */));
}

stacl_ret stacl_mem_range(const stacl_acl *l, aclrtContext ctx, uintptr_t p, uintptr_t *base, size_t *size) {
	CTX();
	void *b = 0;
	aclError rc = l->aclrtMemGetAddressRange((void *)p, &b, size);
	if (rc == 0) *base = (uintptr_t)b;
	return ret(l, rc);
}

stacl_ret stacl_stream_create(const stacl_acl *l, aclrtContext ctx, uint32_t flags, aclrtStream *s) {
	CTX();
	if (flags && l->aclrtCreateStreamWithConfig) return ret(l, l->aclrtCreateStreamWithConfig(s, 0, flags));
	return ret(l, l->aclrtCreateStream(s));
}

stacl_ret stacl_stream_destroy(const stacl_acl *l, aclrtContext ctx, aclrtStream s) { CTX(); return ret(l, l->aclrtDestroyStream(s)); }

stacl_ret stacl_stream_sync(const stacl_acl *l, aclrtContext ctx, aclrtStream s, int32_t timeout_ms) {
	CTX();
	return ret(l, l->aclrtSynchronizeStreamWithTimeout(s, timeout_ms));
}

stacl_ret stacl_event_create(const stacl_acl *l, aclrtContext ctx, uint32_t flags, aclrtEvent *e) { CTX(); return ret(l, l->aclrtCreateEventWithFlag(e, flags)); }
stacl_ret stacl_event_destroy(const stacl_acl *l, aclrtContext ctx, aclrtEvent e) { CTX(); return ret(l, l->aclrtDestroyEvent(e)); }
stacl_ret stacl_event_record(const stacl_acl *l, aclrtContext ctx, aclrtEvent e, aclrtStream s) { CTX(); return ret(l, l->aclrtRecordEvent(e, s)); }

stacl_ret stacl_event_status(const stacl_acl *l, aclrtContext ctx, aclrtEvent e, int32_t *status) {
	CTX();
	*status = 0;
	return ret(l, l->aclrtQueryEventStatus(e, status));
}

stacl_scratch *stacl_scratch_new(void) { return (stacl_scratch *)calloc(1, sizeof(stacl_scratch)); }

int stacl_scratch_reserve(stacl_scratch *sc, size_t n) {
	if (n <= sc->cap) return 0;
	size_t c = sc->cap ? sc->cap : 256;
	while (c < n) c *= 2;
	/* Each array is replaced only once its new block exists, so a failure
	 * leaves the scratch consistent at its old capacity. */
	void *p;
	if (!(p = realloc(sc->dev, c * sizeof *sc->dev))) return -1;
	sc->dev = p;
	if (!(p = realloc(sc->len, c * sizeof *sc->len))) return -1;
	sc->len = p;
	if (!(p = realloc(sc->dsts, c * sizeof *sc->dsts))) return -1;
	sc->dsts = p;
	if (!(p = realloc(sc->srcs, c * sizeof *sc->srcs))) return -1;
	sc->srcs = p;
	if (!(p = realloc(sc->sizes, c * sizeof *sc->sizes))) return -1;
	sc->sizes = p;
	if (!(p = realloc(sc->dmax, c * sizeof *sc->dmax))) return -1;
	sc->dmax = p;
	sc->cap = c;
	return 0;
}

void stacl_scratch_free(stacl_scratch *sc) {
	if (!sc) return;
	free(sc->dev);
	free(sc->len);
	free(sc->dsts);
	free(sc->srcs);
	free(sc->sizes);
	free(sc->dmax);
	free(sc);
}

enum { KIND_H2D = 1, KIND_D2H = 2, KIND_D2D = 3 };

static stacl_move_ret move_fail(const stacl_acl *l, aclError rc, int step, size_t idx, int queued, aclrtStream s) {
	stacl_ret r = ret(l, rc);
	stacl_move_ret m = { r.rc, r.msg, step, idx, 0 };
	if (queued) {
		/* Copies already queued touch the slot: let them finish before
		 * the caller may reuse it. Their own error, if any, is the
		 * stream's; ours is the one reported. */
		l->aclrtSynchronizeStreamWithTimeout(s, -1);
		const char *junk = l->aclGetRecentErrMsg(); /* drop what the sync left */
		(void)junk;
		m.drained = 1;
	}
	return m;
}

stacl_move_ret stacl_move(const stacl_acl *l, aclrtContext ctx, stacl_scratch *sc, size_t count,
                          int mode, int gather, uintptr_t host, uintptr_t ring, uint32_t ordinal,
                          aclrtStream s) {
	stacl_move_ret ok = { 0, 0, 0, 0, 0 };
	aclError rc = stacl_ctx(l, ctx);
	if (rc) return move_fail(l, rc, STACL_STEP_CTX, 0, 0, s);
	/* Every copy takes the pinned slot's HOST address. The device address
	 * aclrtHostRegister gave for the same pages is for kernels and NICs; the
	 * ACL docs say it is not to be used for memory copies. */
	if (mode == STACL_BATCH) {
		uintptr_t off = host;
		for (size_t i = 0; i < count; i++) {
			void *d = (void *)(uintptr_t)sc->dev[i];
			if (gather) {
				sc->dsts[i] = (void *)off;
				sc->srcs[i] = d;
			} else {
				sc->dsts[i] = d;
				sc->srcs[i] = (void *)off;
			}
			sc->sizes[i] = sc->dmax[i] = (size_t)sc->len[i];
			off += sc->len[i];
		}
		memset(&sc->attr, 0, sizeof sc->attr);
		aclrtMemLocation hostLoc = { 0, 0 /* ACL_MEM_LOCATION_TYPE_HOST */ };
		aclrtMemLocation devLoc = { ordinal, 1 /* ACL_MEM_LOCATION_TYPE_DEVICE */ };
		sc->attr.dstLoc = gather ? hostLoc : devLoc;
		sc->attr.srcLoc = gather ? devLoc : hostLoc;
		sc->attr_idx = 0;
		sc->fail = (size_t)-1;
		rc = l->aclrtMemcpyBatchAsync(sc->dsts, sc->dmax, sc->srcs, sc->sizes, count, &sc->attr,
		                              &sc->attr_idx, 1, &sc->fail, s);
		if (rc) return move_fail(l, rc, STACL_STEP_BATCH, sc->fail, 0, s);
		return ok;
	}
	uintptr_t base = mode == STACL_PACK ? ring : host;
	int kind = mode == STACL_PACK ? KIND_D2D : (gather ? KIND_D2H : KIND_H2D);
	size_t total = 0;
	for (size_t i = 0; i < count; i++) total += (size_t)sc->len[i];
	if (mode == STACL_PACK && !gather) {
		/* Scatter: the whole slot into the ring with one H2D first. */
		rc = l->aclrtMemcpyAsync((void *)ring, total, (const void *)host, total, KIND_H2D, s);
		if (rc) return move_fail(l, rc, STACL_STEP_BULK, 0, 0, s);
	}
	uintptr_t off = base;
	for (size_t i = 0; i < count; i++) {
		size_t n = (size_t)sc->len[i];
		void *d = (void *)(uintptr_t)sc->dev[i];
		rc = gather ? l->aclrtMemcpyAsync((void *)off, n, d, n, kind, s)
		            : l->aclrtMemcpyAsync(d, n, (const void *)off, n, kind, s);
		if (rc) return move_fail(l, rc, STACL_STEP_COPY, i, i > 0 || (mode == STACL_PACK && !gather), s);
		off += n;
	}
	if (mode == STACL_PACK && gather) {
		/* Gather: one D2H of the packed ring into the slot. */
		rc = l->aclrtMemcpyAsync((void *)host, total, (const void *)ring, total, KIND_D2H, s);
		if (rc) return move_fail(l, rc, STACL_STEP_BULK, 0, 1, s);
	}
	return ok;
}

stacl_ret stacl_ipc_export(const stacl_acl *l, aclrtContext ctx, uintptr_t p, size_t n, char *key65, uint64_t flags) {
	CTX();
	memset(key65, 0, 65);
	aclError rc = l->aclrtIpcMemGetExportKey((void *)p, n, key65, 65, flags);
	key65[64] = 0;
	return ret(l, rc);
}

stacl_ret stacl_ipc_set_pids(const stacl_acl *l, aclrtContext ctx, const char *key, int32_t *pids, size_t n) {
	CTX();
	return ret(l, l->aclrtIpcMemSetImportPid(key, pids, n));
}

stacl_ret stacl_ipc_import(const stacl_acl *l, aclrtContext ctx, const char *key, uint64_t flags, uintptr_t *p) {
	CTX();
	void *q = 0;
	aclError rc = l->aclrtIpcMemImportByKey(&q, key, flags);
	if (rc == 0) *p = (uintptr_t)q;
	return ret(l, rc);
}

stacl_ret stacl_ipc_close(const stacl_acl *l, aclrtContext ctx, const char *key) { CTX(); return ret(l, l->aclrtIpcMemClose(key)); }

/* ---- VMM ---- */

stacl_ret stacl_vmm_import(const stacl_acl *l, aclrtContext ctx, uint64_t shareable, int32_t dev, uintptr_t *h) {
	CTX();
	aclrtDrvMemHandle q = 0;
	aclError rc = l->aclrtMemImportFromShareableHandle(shareable, dev, &q);
	if (rc == 0) *h = (uintptr_t)q;
	return ret(l, rc);
}

stacl_ret stacl_vmm_reserve(const stacl_acl *l, aclrtContext ctx, size_t n, uintptr_t *va) {
	CTX();
	void *q = 0;
	aclError rc = l->aclrtReserveMemAddress(&q, n, 0, NULL, 0);
	if (rc == 0) *va = (uintptr_t)q;
	return ret(l, rc);
}

stacl_ret stacl_vmm_release(const stacl_acl *l, aclrtContext ctx, uintptr_t va) { CTX(); return ret(l, l->aclrtReleaseMemAddress((void *)va)); }

stacl_ret stacl_vmm_map(const stacl_acl *l, aclrtContext ctx, uintptr_t va, size_t n, uintptr_t h) {
	CTX();
	return ret(l, l->aclrtMapMem((void *)va, n, 0, (aclrtDrvMemHandle)h, 0));
}

stacl_ret stacl_vmm_unmap(const stacl_acl *l, aclrtContext ctx, uintptr_t va) { CTX(); return ret(l, l->aclrtUnmapMem((void *)va)); }

stacl_ret stacl_vmm_access(const stacl_acl *l, aclrtContext ctx, uintptr_t va, size_t n, int32_t flags, uint32_t dev) {
	CTX();
	aclrtMemAccessDesc d;
	memset(&d, 0, sizeof d);
	d.flags = flags;
	d.location.id = dev;
	d.location.type = 1; /* ACL_MEM_LOCATION_TYPE_DEVICE */
	return ret(l, l->aclrtMemSetAccess((void *)va, n, &d, 1));
}

stacl_ret stacl_vmm_free(const stacl_acl *l, aclrtContext ctx, uintptr_t h) { CTX(); return ret(l, l->aclrtFreePhysical((aclrtDrvMemHandle)h)); }

static void stacl_prop(aclrtPhysicalMemProp *p, uint32_t dev) {
	memset(p, 0, sizeof *p);
	p->memAttr = 4; /* ACL_HBM_MEM_HUGE */
	p->location.id = dev;
	p->location.type = 1;
}

stacl_ret stacl_vmm_granularity(const stacl_acl *l, aclrtContext ctx, uint32_t dev, size_t *g) {
	CTX();
	aclrtPhysicalMemProp p;
	stacl_prop(&p, dev);
	return ret(l, l->aclrtMemGetAllocationGranularity(&p, 0 /* MINIMUM */, g));
}

stacl_ret stacl_vmm_malloc(const stacl_acl *l, aclrtContext ctx, uint32_t dev, size_t n, uintptr_t *h) {
	CTX();
	aclrtPhysicalMemProp p;
	stacl_prop(&p, dev);
	aclrtDrvMemHandle q = 0;
	aclError rc = l->aclrtMallocPhysical(&q, n, &p, 0);
	if (rc == 0) *h = (uintptr_t)q;
	return ret(l, rc);
}

stacl_ret stacl_vmm_retain(const stacl_acl *l, aclrtContext ctx, uintptr_t va, uintptr_t *h) {
	CTX();
	aclrtDrvMemHandle q = 0;
	aclError rc = l->aclrtMemRetainAllocationHandle((void *)va, &q);
	if (rc == 0) *h = (uintptr_t)q;
	return ret(l, rc);
}

stacl_ret stacl_vmm_export(const stacl_acl *l, aclrtContext ctx, uintptr_t h, uint64_t flags, uint64_t *shareable) {
	CTX();
	return ret(l, l->aclrtMemExportToShareableHandle((aclrtDrvMemHandle)h, 0 /* ACL_MEM_HANDLE_TYPE_NONE */, flags, shareable));
}

stacl_ret stacl_vmm_set_pid(const stacl_acl *l, aclrtContext ctx, uint64_t shareable, int32_t pid) {
	CTX();
	return ret(l, l->aclrtMemSetPidToShareableHandle(shareable, &pid, 1));
}
