/* A fake libamdhip64 for tests/fake_runtime.rs: one 24 GiB device with bookkeeping, so the
 * backend's loading, FFI calls, capture lifecycle and virtual memory run without an AMD GPU.
 *
 * It is not HIP: device pointers are made-up addresses never dereferenced, graphs cost
 * 64 KiB of "driver memory" per node, graph allocations go to a pool that hipDeviceGraphMemTrim
 * returns. Compiled twice by the test: as HIP 6.2 (every symbol) and with -DFAKE_HIP5 as HIP
 * 5.2 (no R0600 properties, no graph-memory query, no stream-ordered allocation, no VMM).
 * fake_configure() sets the knobs; fake_graph_exec_bytes() lets the test check teardown.
 * PROPS_R0000_GCN and PROPS_R0600_GCN (offsets) come from the test's -D flags. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MIB (1024ull * 1024ull)
#define GIB (1024ull * MIB)
#define MAX_ALLOCS 4096

static uint64_t total = 24 * GIB;
static uint64_t others = 0; /* memory held by other processes (visible in free) */
static uint64_t allocated = 0, exec_bytes = 0, pool_reserved = 0, pool_used = 0, pool_high = 0;
static int integrated = 0, vmm = 1, init_error = 0, version = 60240000, attr_4_bytes = 0;
static int current = -1, capturing = 0, nodes = 0;
static uint64_t capture_alloc = 0, next_addr = 0x100000000000ull;
static struct { uint64_t addr, bytes; } allocs[MAX_ALLOCS];

struct graph { int nodes; uint64_t alloc; };
static struct graph graphs[64];
static int n_graphs = 0;
static struct graph *execs[64];
static int stream_token;
static int invalidate_next = 0, live_graphs = 0, fail_next_exec_destroy = 0;

void fake_configure(int v, int apu, int vmm_ok, int init_err, uint64_t other_bytes, int four) {
  version = v; integrated = apu; vmm = vmm_ok; init_error = init_err; others = other_bytes;
  attr_4_bytes = four;
}
uint64_t fake_graph_exec_bytes(void) { return exec_bytes; }
uint64_t fake_pool_reserved(void) { return pool_reserved; }
/* The next hipStreamEndCapture fails as invalidated but still hands back a graph. */
void fake_invalidate_next_capture(void) { invalidate_next = 1; }
uint64_t fake_live_graphs(void) { return (uint64_t)live_graphs; }
/* The next hipGraphExecDestroy fails with hipErrorUnknown. */
void fake_fail_next_exec_destroy(void) { fail_next_exec_destroy = 1; }
/* Reservations and mappings not yet freed / unmapped. */
static int live_ranges = 0, live_maps = 0;
uint64_t fake_live_ranges(void) { return (uint64_t)live_ranges; }
uint64_t fake_live_maps(void) { return (uint64_t)live_maps; }

static uint64_t free_bytes(void) {
  uint64_t used = allocated + exec_bytes + pool_reserved + others;
  return used > total ? 0 : total - used;
}
static uint64_t new_addr(uint64_t bytes) {
  uint64_t a = next_addr;
  next_addr += (bytes + 2 * MIB - 1) / (2 * MIB) * (2 * MIB) + 2 * MIB;
  return a;
}
static int track(uint64_t addr, uint64_t bytes) {
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (!allocs[i].addr) { allocs[i].addr = addr; allocs[i].bytes = bytes; allocated += bytes; return 0; }
  return 2;
}
static int untrack(uint64_t addr) {
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (allocs[i].addr == addr) { allocated -= allocs[i].bytes; allocs[i].addr = 0; return 0; }
  return 1;
}
static int need_device(void) { return current == 0 ? 0 : 101; }

int hipInit(unsigned flags) { return flags ? 1 : init_error; }
int hipGetDeviceCount(int *n) { *n = 1; return 0; }
int hipRuntimeGetVersion(int *v) { *v = version; return 0; }
int hipDriverGetVersion(int *v) { *v = version; return 0; }
int hipSetDevice(int d) { if (d != 0) return 101; current = d; return 0; }
int hipDeviceGetName(char *name, int len, int d) {
  if (d != 0 || len < 12) return 1;
  strcpy(name, "Fake Radeon");
  return 0;
}
int hipDeviceTotalMem(size_t *b, int d) { if (d) return 101; *b = total; return 0; }
int hipDeviceGetAttribute(int *v, int attr, int d) {
  if (d) return 101;
  if (attr == 16) { *v = integrated; return 0; }
  if (attr == 89) {
#ifdef FAKE_HIP5
    return 1; /* HIP 5.2 does not know the attribute */
#else
    *v = vmm; return 0;
#endif
  }
  return 1;
}
int hipDeviceGetPCIBusId(char *bus, int len, int d) {
  if (d || len < 13) return 1;
  strcpy(bus, "0000:03:00.0");
  return 0;
}
int hipMemGetInfo(size_t *f, size_t *t) {
  if (need_device()) return 101;
  *f = free_bytes(); *t = total; return 0;
}
int hipDeviceSynchronize(void) { return capturing ? 900 : need_device(); }
int hipMalloc(void **p, size_t bytes) {
  if (capturing) return 901;
  if (bytes > free_bytes()) return 2;
  uint64_t a = new_addr(bytes);
  if (track(a, bytes)) return 2;
  *p = (void *)a; return 0;
}
int hipFree(void *p) { return untrack((uint64_t)p); }

#ifdef FAKE_HIP5
int hipGetDeviceProperties(void *props, int d) {
  if (d) return 101;
  strcpy((char *)props, "Fake Radeon");
  strcpy((char *)props + PROPS_R0000_GCN, "gfx1030");
  return 0;
}
#else
int hipGetDevicePropertiesR0600(void *props, int d) {
  if (d) return 101;
  strcpy((char *)props, "Fake Radeon");
  strcpy((char *)props + PROPS_R0600_GCN, "gfx942:sramecc+:xnack-");
  return 0;
}
/* Present in HIP 6 too, with the 5.x layout; memplan must prefer R0600. */
int hipGetDeviceProperties(void *props, int d) {
  if (d) return 101;
  strcpy((char *)props + PROPS_R0000_GCN, "wrong-layout");
  return 0;
}
#endif

int hipStreamCreateWithFlags(void **s, unsigned flags) { (void)flags; *s = &stream_token; return 0; }
int hipStreamDestroy(void *s) { return s == &stream_token ? 0 : 400; }
int hipStreamSynchronize(void *s) { return s == &stream_token ? 0 : 400; }
int hipStreamBeginCapture(void *s, int mode) {
  if (s != &stream_token || mode < 0 || mode > 2) return 1;
  if (capturing) return 401;
  capturing = 1; nodes = 0; capture_alloc = 0; return 0;
}
int hipStreamEndCapture(void *s, void **g) {
  if (s != &stream_token) return 400;
  if (!capturing) return 401;
  capturing = 0;
  if (n_graphs >= 64) return 2;
  graphs[n_graphs].nodes = nodes; graphs[n_graphs].alloc = capture_alloc;
  *g = &graphs[n_graphs++];
  live_graphs++;
  if (invalidate_next) { invalidate_next = 0; return 901; }
  return 0;
}
int hipGraphInstantiate(void **exec, void *g, void *err_node, char *log, size_t log_len) {
  (void)err_node; (void)log; (void)log_len;
  struct graph *gr = g;
  for (int i = 0; i < 64; i++)
    if (!execs[i]) {
      execs[i] = gr; exec_bytes += (uint64_t)gr->nodes * 64 * 1024; *exec = &execs[i];
      if (gr->alloc > pool_reserved) pool_reserved = gr->alloc;
      return 0;
    }
  return 2;
}
int hipGraphLaunch(void *exec, void *s) {
  if (s != &stream_token || !exec || !*(struct graph **)exec) return 400;
  pool_used = 0;
  uint64_t a = (*(struct graph **)exec)->alloc;
  if (a > pool_high) pool_high = a;
  return 0;
}
int hipGraphExecDestroy(void *exec) {
  struct graph **e = exec;
  if (fail_next_exec_destroy) { fail_next_exec_destroy = 0; return 999; }
  if (!e || !*e) return 400;
  exec_bytes -= (uint64_t)(*e)->nodes * 64 * 1024; *e = NULL; return 0;
}
int hipGraphDestroy(void *g) {
  if (!g) return 400;
  live_graphs--; return 0;
}
int hipMemsetAsync(void *p, int v, size_t n, void *s) {
  (void)p; (void)v; (void)n;
  if (s != &stream_token) return 400;
  if (capturing) nodes++;
  return 0;
}

#ifndef FAKE_HIP5
int hipMallocAsync(void **p, size_t bytes, void *s) {
  if (s != &stream_token) return 400;
  if (!capturing) return 801;
  capture_alloc += bytes; *p = (void *)new_addr(bytes); return 0;
}
int hipFreeAsync(void *p, void *s) { (void)p; return s == &stream_token ? 0 : 400; }
int hipDeviceGraphMemTrim(int d) {
  if (d) return 101;
  for (int i = 0; i < 64; i++) if (execs[i]) return 0; /* still in use */
  pool_reserved = 0; return 0;
}
int hipDeviceGetGraphMemAttribute(int d, int attr, void *value) {
  uint64_t v;
  if (d) return 101;
  switch (attr) {
    case 0: v = pool_used; break;
    case 1: v = pool_high; break;
    case 2: v = pool_reserved; break;
    case 3: v = pool_reserved > pool_high ? pool_reserved : pool_high; break;
    default: return 1;
  }
  if (attr_4_bytes) *(uint32_t *)value = (uint32_t)v; else *(uint64_t *)value = v;
  return 0;
}
int hipMemGetAllocationGranularity(size_t *g, const void *prop, int option) {
  /* hipMemAllocationProp (5.4+ layout): type at 0 must be pinned (1), location.type at 8
   * must be device (1), location.id at 12 the device. */
  const int *p = prop;
  if (option != 0 || p[0] != 1 || p[2] != 1 || p[3] != 0) return 1;
  *g = 2 * MIB; return 0;
}
int hipMemAddressReserve(void **p, size_t size, size_t align, void *addr, unsigned long long flags) {
  if (align || addr || flags || size % (2 * MIB)) return 1;
  *p = (void *)new_addr(size); live_ranges++; return 0;
}
int hipMemAddressFree(void *p, size_t size) { if (!p || !size || !live_ranges) return 1; live_ranges--; return 0; }
int hipMemCreate(void **h, size_t size, const void *prop, unsigned long long flags) {
  const int *pr = prop;
  if (flags || size % (2 * MIB) || pr[0] != 1) return 1;
  if (size > free_bytes()) return 2;
  uint64_t a = new_addr(size);
  if (track(a, size)) return 2;
  *h = (void *)a; return 0;
}
int hipMemRelease(void *h) { return untrack((uint64_t)h); }
int hipMemMap(void *p, size_t size, size_t offset, void *h, unsigned long long flags) {
  if (!(p && h && !offset && !flags && size % (2 * MIB) == 0)) return 1;
  live_maps++; return 0;
}
int hipMemUnmap(void *p, size_t size) { if (!p || !size || !live_maps) return 1; live_maps--; return 0; }
int hipMemSetAccess(void *p, size_t size, const void *desc, size_t count) {
  const int *d = desc; /* hipMemAccessDesc: location {type, id}, flags */
  return p && size && count == 1 && d[0] == 1 && d[1] == 0 && d[2] == 3 ? 0 : 1;
}
#endif
