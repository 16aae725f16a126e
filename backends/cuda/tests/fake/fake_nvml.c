/*
 * A fake NVML (soname libnvidia-ml.so.1) for memplan's tests: one device known by the fake
 * driver's UUID, nvmlMemory_v2_t with its version word checked, and 72 compute processes (so
 * the first call with memplan's 64-entry buffer says NVML_ERROR_INSUFFICIENT_SIZE): 70 others
 * of 1 MiB, this process with 5 MiB, and one whose usage is NVML_VALUE_NOT_AVAILABLE (2 MiB
 * when FAKE_NVML_ALL_KNOWN is set).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OK 0
#define E_UNINITIALIZED 1
#define E_INVALID_ARGUMENT 2
#define E_NOT_FOUND 6
#define E_INSUFFICIENT_SIZE 7
#define NPROC 72

typedef struct { unsigned version; unsigned long long total, reserved, free, used; } mem_v2_t;
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } proc_t;

static int inits;
static char device_token;

long long fake_nvml_state(const char *key) { return !strcmp(key, "inits") ? inits : -1; }

int nvmlInit_v2(void) { inits++; return OK; }
int nvmlShutdown(void) { if (!inits) return E_UNINITIALIZED; inits--; return OK; }
int nvmlDeviceGetHandleByUUID(const char *uuid, void **dev) {
    if (!inits) return E_UNINITIALIZED;
    if (strcmp(uuid, "MIG-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf")) return E_NOT_FOUND;
    *dev = &device_token;
    return OK;
}
int nvmlDeviceGetMemoryInfo_v2(void *dev, mem_v2_t *m) {
    if (dev != &device_token || m->version != (sizeof(mem_v2_t) | (2u << 24))) return E_INVALID_ARGUMENT;
    /* NVML counts the reserve on top of what cuMemGetInfo reports (fake_cuda.c: 24 GiB). */
    m->total = (24ull << 30) + (300ull << 20); m->reserved = 300ull << 20; m->used = 1ull << 30; m->free = m->total - m->used - m->reserved;
    return OK;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned *count, proc_t *infos) {
    if (dev != &device_token || !count) return E_INVALID_ARGUMENT;
    if (*count < NPROC) { *count = NPROC; return E_INSUFFICIENT_SIZE; }
    for (int i = 0; i < NPROC; i++) { infos[i].pid = 1000 + i; infos[i].used = 1ull << 20; infos[i].gi = infos[i].ci = 0; }
    infos[70].pid = (unsigned)getpid(); infos[70].used = 5ull << 20;
    infos[71].used = getenv("FAKE_NVML_ALL_KNOWN") ? 2ull << 20 : ~0ull;
    *count = NPROC;
    return OK;
}
