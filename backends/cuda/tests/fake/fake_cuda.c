/*
 * A fake CUDA driver (libcuda.so.1) for memplan's tests: exactly the entry points the backend
 * calls, with the C ABI of cuda.h, and a tiny model of one 24 GiB GPU behind them (free memory,
 * raw and VMM allocations, streams, stream capture, graphs with allocation nodes, the graph
 * pool, modules). It checks what it is given (struct layouts, kernel arguments, capture state)
 * and returns the driver's error codes, so the backend's FFI plumbing, gating and teardown run
 * end to end without a GPU. It says nothing about what a real GPU does.
 *
 * Built by the tests with -Wl,-soname,libcuda.so.1. Flavours:
 *   -DFAKE_OLD_DRIVER   reports CUDA 11.2 and does not export the 11.4 symbols
 *   -DFAKE_NO_DEVICE    cuInit returns CUDA_ERROR_NO_DEVICE
 * fake_cuda_state(key) exposes counters to the tests; fake_cuda_fail_next(call) makes the next
 * cuMemMap or cuMemSetAccess fail, or every cuCtxSetCurrent until fake_cuda_fail_next("none").
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define OK 0
#define E_INVALID_VALUE 1
#define E_OOM 2
#define E_NOT_INITIALIZED 3
#define E_NO_DEVICE 100
#define E_INVALID_DEVICE 101
#define E_INVALID_PTX 218
#define E_INVALID_HANDLE 400
#define E_ILLEGAL_STATE 401
#define E_NOT_FOUND 500
#define E_CAPTURE_INVALIDATED 901
#define E_FROM_THE_FUTURE 4242 /* a code no binding knows (a driver newer than the bindings) */

typedef uint64_t dptr;
typedef struct { int type; int id; } loc_t;
typedef struct { int type; int handle_types; loc_t location; void *win32; unsigned char flags[8]; } prop_t;
typedef struct { loc_t location; int flags; } access_t;

#define MIB (1ull << 20)
#define GRAN (2 * MIB)
#define TOTAL (24ull << 30)
#define EXEC_BYTES_PER_NODE (64 * 1024)
#define MAX 64

static int inited, ctx_refs, current_set, fail_ctx;
static uint64_t free_bytes = TOTAL - 512 * MIB; /* the driver's own share */
static uint64_t pool_reserved;
__attribute__((unused)) static uint64_t pool_reserved_high, pool_used_high;
static struct { dptr p; uint64_t n; } allocs[MAX];
static struct { int live, capturing, invalid, kernels; uint64_t alloc; } streams[MAX];
static struct { int live, kernels; uint64_t alloc; } graphs[MAX];
static struct { int live, graph; uint64_t bytes; } execs[MAX];
static struct { int live; uint64_t n; } handles[MAX];
static struct { int live; dptr p; uint64_t n; } ranges[MAX];
static struct { int live; dptr p; uint64_t n; } maps[MAX];
static int modules, mappings, bad_unmaps, fail_next_map, fail_next_access, fail_next_alloc, fail_next_unmap;
static dptr next_addr = 0x7f0000000000ull;
static char ctx_token;
__attribute__((unused)) static char fn_token;

static uint64_t round_up(uint64_t n) { return (n + GRAN - 1) / GRAN * GRAN; }

long long fake_cuda_state(const char *key) {
    int i, n = 0;
    if (!strcmp(key, "free")) return (long long)free_bytes;
    if (!strcmp(key, "ctx_refs")) return ctx_refs;
    if (!strcmp(key, "modules")) return modules;
    if (!strcmp(key, "mappings")) return mappings;
    if (!strcmp(key, "bad_unmaps")) return bad_unmaps;
    if (!strcmp(key, "pool_reserved")) return (long long)pool_reserved;
    for (i = 0; i < MAX; i++) {
        if (!strcmp(key, "allocs")) n += allocs[i].p != 0;
        if (!strcmp(key, "streams")) n += streams[i].live;
        if (!strcmp(key, "graphs")) n += graphs[i].live;
        if (!strcmp(key, "execs")) n += execs[i].live;
        if (!strcmp(key, "handles")) n += handles[i].live;
        if (!strcmp(key, "ranges")) n += ranges[i].live;
    }
    return n;
}

int cuDriverGetVersion(int *v) {
#ifdef FAKE_OLD_DRIVER
    *v = 11020;
#else
    *v = 12040;
#endif
    return OK;
}
int cuInit(unsigned flags) {
    if (flags) return E_INVALID_VALUE;
#ifdef FAKE_NO_DEVICE
    return E_NO_DEVICE;
#endif
    inited = 1;
    return OK;
}
int cuGetErrorName(int e, const char **s) { *s = e == E_OOM ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_FAKE"; return OK; }
int cuDeviceGetCount(int *n) { if (!inited) return E_NOT_INITIALIZED; *n = 1; return OK; }
int cuDeviceGet(int *d, int ord) { if (!inited) return E_NOT_INITIALIZED; if (ord != 0) return E_INVALID_DEVICE; *d = 0; return OK; }
int cuDeviceGetName(char *name, int len, int dev) {
    if (dev != 0) return E_INVALID_DEVICE;
    if (len < 32) return E_INVALID_VALUE;
    strcpy(name, "NVIDIA Fake GPU MIG 1g.24gb");
    return OK;
}
int cuDeviceTotalMem_v2(size_t *b, int dev) { if (dev) return E_INVALID_DEVICE; *b = TOTAL; return OK; }
int cuDeviceGetAttribute(int *v, int attr, int dev) {
    if (dev) return E_INVALID_DEVICE;
    switch (attr) {
    case 75: *v = 8; break;           /* compute capability major */
    case 76: *v = 9; break;           /* minor */
    case 18: *v = 0; break;           /* integrated */
    case 102: *v = 1; break;          /* virtual memory management */
    case 115: *v = 1; break;          /* memory pools */
    case 33: *v = 0x41; break;        /* PCI bus */
    case 34: *v = 0; break;
    case 50: *v = 0; break;
    default: return E_INVALID_VALUE;
    }
    return OK;
}
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { if (dev) return E_INVALID_DEVICE; ctx_refs++; *ctx = &ctx_token; return OK; }
int cuDevicePrimaryCtxRelease_v2(int dev) { if (dev || ctx_refs == 0) return E_INVALID_VALUE; ctx_refs--; return OK; }
int cuCtxSetCurrent(void *ctx) { if (ctx != &ctx_token || fail_ctx) return 201; current_set = 1; return OK; }
int cuCtxSynchronize(void) { return current_set ? OK : 201; }
int cuMemGetInfo_v2(size_t *f, size_t *t) { if (!current_set) return 201; *f = free_bytes; *t = TOTAL; return OK; }
int cuMemAlloc_v2(dptr *p, size_t n) {
    int i;
    if (fail_next_alloc) { fail_next_alloc = 0; return E_FROM_THE_FUTURE; }
    if (n == 0) return E_INVALID_VALUE;
    if (round_up(n) > free_bytes) return E_OOM;
    for (i = 0; i < MAX && allocs[i].p; i++) {}
    if (i == MAX) return E_OOM;
    allocs[i].p = next_addr; allocs[i].n = round_up(n); next_addr += round_up(n);
    free_bytes -= allocs[i].n; *p = allocs[i].p;
    return OK;
}
int cuMemFree_v2(dptr p) {
    for (int i = 0; i < MAX; i++)
        if (allocs[i].p == p && p) { free_bytes += allocs[i].n; allocs[i].p = 0; return OK; }
    return E_INVALID_VALUE;
}

#ifndef FAKE_OLD_DRIVER
int cuDeviceGetUuid_v2(unsigned char *u, int dev) { if (dev) return E_INVALID_DEVICE; for (int i = 0; i < 16; i++) u[i] = (unsigned char)(0xa0 + i); return OK; }
int cuDeviceGetGraphMemAttribute(int dev, int attr, void *value) {
    uint64_t v;
    if (dev) return E_INVALID_DEVICE;
    switch (attr) {
    case 0: v = 0; break;                    /* used, current: allocation nodes free in-graph */
    case 1: v = pool_used_high; break;
    case 2: v = pool_reserved; break;
    case 3: v = pool_reserved_high; break;
    default: return E_INVALID_VALUE;
    }
    memcpy(value, &v, sizeof v);
    return OK;
}
int cuDeviceGraphMemTrim(int dev) { if (dev) return E_INVALID_DEVICE; free_bytes += pool_reserved; pool_reserved = 0; return OK; }

static int stream_index(void *s) { intptr_t i = (intptr_t)s - 1; return (i >= 0 && i < MAX && streams[i].live) ? (int)i : -1; }
int cuStreamCreate(void **s, unsigned flags) {
    int i;
    if (flags != 1) return E_INVALID_VALUE; /* memplan asks for a non-blocking stream */
    for (i = 0; i < MAX && streams[i].live; i++) {}
    if (i == MAX) return E_OOM;
    memset(&streams[i], 0, sizeof streams[i]); streams[i].live = 1; *s = (void *)(intptr_t)(i + 1);
    return OK;
}
int cuStreamDestroy_v2(void *s) { int i = stream_index(s); if (i < 0) return E_INVALID_HANDLE; streams[i].live = 0; return OK; }
int cuStreamSynchronize(void *s) { int i = stream_index(s); if (i < 0) return E_INVALID_HANDLE; return streams[i].capturing ? E_CAPTURE_INVALIDATED : OK; }
int cuStreamBeginCapture_v2(void *s, int mode) {
    int i = stream_index(s);
    if (i < 0) return E_INVALID_HANDLE;
    if (mode != 1 || streams[i].capturing) return E_ILLEGAL_STATE; /* memplan uses thread-local mode */
    streams[i].capturing = 1; streams[i].invalid = 0; streams[i].kernels = 0; streams[i].alloc = 0;
    return OK;
}
int cuStreamIsCapturing(void *s, int *status) {
    int i = stream_index(s);
    if (i < 0) return E_INVALID_HANDLE;
    *status = !streams[i].capturing ? 0 : streams[i].invalid ? 2 : 1;
    return OK;
}
int cuStreamEndCapture(void *s, void **graph) {
    int i = stream_index(s), g;
    if (i < 0) return E_INVALID_HANDLE;
    if (!streams[i].capturing) return E_ILLEGAL_STATE;
    streams[i].capturing = 0;
    *graph = NULL;
    if (streams[i].invalid) return E_CAPTURE_INVALIDATED;
    for (g = 0; g < MAX && graphs[g].live; g++) {}
    if (g == MAX) return E_OOM;
    graphs[g].live = 1; graphs[g].kernels = streams[i].kernels; graphs[g].alloc = streams[i].alloc;
    *graph = (void *)(intptr_t)(g + 1);
    return OK;
}
int cuGraphDestroy(void *graph) { intptr_t g = (intptr_t)graph - 1; if (g < 0 || g >= MAX || !graphs[g].live) return E_INVALID_HANDLE; graphs[g].live = 0; return OK; }
int cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
    intptr_t g = (intptr_t)graph - 1; int e;
    if (g < 0 || g >= MAX || !graphs[g].live || flags) return E_INVALID_VALUE;
    for (e = 0; e < MAX && execs[e].live; e++) {}
    if (e == MAX) return E_OOM;
    execs[e].live = 1; execs[e].graph = (int)g;
    execs[e].bytes = EXEC_BYTES_PER_NODE * (uint64_t)(graphs[g].kernels + 1);
    if (execs[e].bytes > free_bytes) { execs[e].live = 0; return E_OOM; }
    free_bytes -= execs[e].bytes;
    *exec = (void *)(intptr_t)(e + 1);
    return OK;
}
int cuGraphExecDestroy(void *exec) { intptr_t e = (intptr_t)exec - 1; if (e < 0 || e >= MAX || !execs[e].live) return E_INVALID_HANDLE; free_bytes += execs[e].bytes; execs[e].live = 0; return OK; }
int cuGraphLaunch(void *exec, void *s) {
    intptr_t e = (intptr_t)exec - 1; int i = stream_index(s); uint64_t need;
    if (e < 0 || e >= MAX || !execs[e].live || i < 0 || streams[i].capturing) return E_INVALID_HANDLE;
    need = round_up(graphs[execs[e].graph].alloc);
    if (!graphs[execs[e].graph].live) return E_INVALID_HANDLE;
    if (need > pool_reserved) {
        if (need - pool_reserved > free_bytes) return E_OOM;
        free_bytes -= need - pool_reserved; pool_reserved = need;
    }
    if (pool_reserved > pool_reserved_high) pool_reserved_high = pool_reserved;
    if (graphs[execs[e].graph].alloc > pool_used_high) pool_used_high = graphs[execs[e].graph].alloc;
    return OK;
}
int cuMemAllocAsync(dptr *p, size_t n, void *s) {
    int i = stream_index(s);
    if (i < 0 || !streams[i].capturing || n == 0) return E_INVALID_VALUE; /* memplan allocates only in capture */
    streams[i].alloc += n; *p = 0x600000000000ull + streams[i].alloc;
    return OK;
}
int cuMemFreeAsync(dptr p, void *s) { int i = stream_index(s); if (i < 0 || !streams[i].capturing || !p) return E_INVALID_VALUE; return OK; }
int cuModuleLoadData(void **m, const void *image) {
    if (!strstr((const char *)image, "memplan_touch") || !strstr((const char *)image, ".entry")) return E_INVALID_PTX;
    modules++; *m = &modules;
    return OK;
}
int cuModuleGetFunction(void **f, void *m, const char *name) { if (m != &modules) return E_INVALID_HANDLE; if (strcmp(name, "memplan_touch")) return E_NOT_FOUND; *f = &fn_token; return OK; }
int cuModuleUnload(void *m) { if (m != &modules || modules == 0) return E_INVALID_HANDLE; modules--; return OK; }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, void *s, void **params, void **extra) {
    int i = stream_index(s);
    if (f != &fn_token || i < 0 || !params || extra || shmem) return E_INVALID_VALUE;
    if (gx * gy * gz != 1 || bx != 32 || by * bz != 1) return E_INVALID_VALUE;
    if (*(unsigned *)params[1] > 32) return E_INVALID_VALUE;          /* n <= threads */
    if (*(dptr *)params[0] == 0 && *(unsigned *)params[1] != 0) return E_INVALID_VALUE;
    if (streams[i].capturing) streams[i].kernels++;
    return OK;
}
#endif /* !FAKE_OLD_DRIVER: the 11.4 symbols */

static int check_prop(const prop_t *p) {
    return p->type == 1 && p->handle_types == 0 && p->location.type == 1 && p->location.id == 0 ? OK : E_INVALID_VALUE;
}
int cuMemGetAllocationGranularity(size_t *g, const prop_t *p, int option) { if (option != 0 || check_prop(p)) return E_INVALID_VALUE; *g = GRAN; return OK; }
int cuMemAddressReserve(dptr *p, size_t n, size_t align, dptr addr, unsigned long long flags) {
    int i;
    if (n == 0 || n % GRAN || align || addr || flags) return E_INVALID_VALUE;
    for (i = 0; i < MAX && ranges[i].live; i++) {}
    if (i == MAX) return E_OOM;
    ranges[i].live = 1; ranges[i].p = next_addr; ranges[i].n = n; next_addr += n; *p = ranges[i].p;
    return OK;
}
int cuMemAddressFree(dptr p, size_t n) {
    for (int i = 0; i < MAX; i++) if (ranges[i].live && ranges[i].p == p && ranges[i].n == n) { ranges[i].live = 0; return OK; }
    return E_INVALID_VALUE;
}
int cuMemCreate(uint64_t *h, size_t n, const prop_t *p, unsigned long long flags) {
    int i;
    if (n == 0 || n % GRAN || flags || check_prop(p)) return E_INVALID_VALUE;
    if (n > free_bytes) return E_OOM;
    for (i = 0; i < MAX && handles[i].live; i++) {}
    if (i == MAX) return E_OOM;
    handles[i].live = 1; handles[i].n = n; free_bytes -= n; *h = (uint64_t)(i + 1);
    return OK;
}
int cuMemRelease(uint64_t h) { if (h == 0 || h > MAX || !handles[h - 1].live) return E_INVALID_HANDLE; handles[h - 1].live = 0; free_bytes += handles[h - 1].n; return OK; }
int cuMemMap(dptr p, size_t n, size_t off, uint64_t h, unsigned long long flags) {
    int i, m;
    if (fail_next_map) { fail_next_map = 0; return E_INVALID_VALUE; }
    if (off || flags || h == 0 || h > MAX || !handles[h - 1].live || handles[h - 1].n != n) return E_INVALID_VALUE;
    for (m = 0; m < MAX; m++) /* a real driver refuses to map over a live mapping */
        if (maps[m].live && p < maps[m].p + maps[m].n && maps[m].p < p + n) return E_INVALID_VALUE;
    for (i = 0; i < MAX; i++) if (ranges[i].live && p >= ranges[i].p && p + n <= ranges[i].p + ranges[i].n) break;
    if (i == MAX) return E_INVALID_VALUE;
    for (m = 0; m < MAX && maps[m].live; m++) {}
    if (m == MAX) return E_OOM;
    maps[m].live = 1; maps[m].p = p; maps[m].n = n; mappings++;
    return OK;
}
int cuMemUnmap(dptr p, size_t n) {
    if (fail_next_unmap) { fail_next_unmap = 0; return E_INVALID_VALUE; }
    for (int m = 0; m < MAX; m++)
        if (maps[m].live && maps[m].p == p && maps[m].n == n) { maps[m].live = 0; mappings--; return OK; }
    bad_unmaps++; /* nothing mapped exactly there */
    return E_INVALID_VALUE;
}
int cuMemSetAccess(dptr p, size_t n, const access_t *d, size_t count) {
    (void)p; (void)n;
    if (fail_next_access) { fail_next_access = 0; return E_INVALID_VALUE; }
    return count == 1 && d->location.type == 1 && d->location.id == 0 && d->flags == 3 ? OK : E_INVALID_VALUE;
}
/* The next call named `call` (cuMemMap, cuMemSetAccess, cuMemUnmap) fails with CUDA_ERROR_INVALID_VALUE
 * (cuMemAlloc_v2: with code 4242, which no binding knows);
 * "cuCtxSetCurrent" fails every cuCtxSetCurrent (CUDA_ERROR_INVALID_CONTEXT) until "none". */
long long fake_cuda_fail_next(const char *call) {
    if (!strcmp(call, "cuMemMap")) fail_next_map = 1;
    else if (!strcmp(call, "cuCtxSetCurrent")) fail_ctx = 1; /* until "none" */
    else if (!strcmp(call, "cuMemAlloc_v2")) fail_next_alloc = 1; /* with an unknown code */
    else if (!strcmp(call, "cuMemUnmap")) fail_next_unmap = 1;
    else if (!strcmp(call, "none")) fail_next_map = fail_next_access = fail_ctx = fail_next_alloc = fail_next_unmap = 0;
    else if (!strcmp(call, "cuMemSetAccess")) fail_next_access = 1;
    else return -1;
    return 0;
}
