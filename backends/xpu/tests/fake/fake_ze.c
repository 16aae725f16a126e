/* A fake Level Zero loader for the xpu backend's tests: one GPU, Sysman memory modules and
 * allocation accounting, compiled per scenario with -D flags:
 *   FREE_EQUALS_TOTAL  Sysman reports free == size whatever is allocated (i915 non-root)
 *   INTEGRATED         the device is integrated and lists one system-memory module
 *   NO_ZES_INIT        the loader predates spec 1.5 (no zesInit/zesDriverGet/zesDeviceGet)
 *   NO_VMM             zeVirtualMemQueryPageSize returns ZE_RESULT_ERROR_UNSUPPORTED_FEATURE
 *   NO_MEM_FREE        the required symbol zeMemFree is missing
 * It uses the real headers, so it also proves the Rust declarations call what they claim.
 * The core device handle doubles as the Sysman device handle, so the ZES_ENABLE_SYSMAN route
 * works too. fake_state_calls() counts zesMemoryGetState calls (for the cache test). */
#include <level_zero/ze_api.h>
#include <level_zero/zes_api.h>
#include <stdlib.h>
#include <string.h>

#define GIB (1024ull * 1024ull * 1024ull)
#define TOTAL (16ull * GIB)
#define BASELINE_USED (1ull * GIB)
#define PAGE (2ull * 1024ull * 1024ull)

static int drv, dev, ctx, mem;
static unsigned long long used = BASELINE_USED;
static int state_calls;
static int contexts;

int fake_state_calls(void) { return state_calls; }
int fake_live_contexts(void) { return contexts; }

static ze_result_t list(uint32_t *n, void **out, void *one) {
    if (!n) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (out && *n >= 1) out[0] = one;
    *n = 1;
    return ZE_RESULT_SUCCESS;
}

ze_result_t zeInit(ze_init_flags_t f) { return f == ZE_INIT_FLAG_GPU_ONLY ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ENUMERATION; }
ze_result_t zeDriverGet(uint32_t *n, ze_driver_handle_t *d) { return list(n, (void **)d, &drv); }
ze_result_t zeDriverGetProperties(ze_driver_handle_t d, ze_driver_properties_t *p) {
    if (d != (void *)&drv || p->stype != ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    p->driverVersion = 17002;
    return ZE_RESULT_SUCCESS;
}
ze_result_t zeDriverGetApiVersion(ze_driver_handle_t d, ze_api_version_t *v) { *v = ZE_MAKE_VERSION(1, 4); return ZE_RESULT_SUCCESS; }
ze_result_t zeDeviceGet(ze_driver_handle_t d, uint32_t *n, ze_device_handle_t *o) { return list(n, (void **)o, &dev); }
ze_result_t zeDeviceGetSubDevices(ze_device_handle_t d, uint32_t *n, ze_device_handle_t *o) { *n = 0; return ZE_RESULT_SUCCESS; }
ze_result_t zeDeviceGetProperties(ze_device_handle_t d, ze_device_properties_t *p) {
    if (d != (void *)&dev || p->stype != ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    p->type = ZE_DEVICE_TYPE_GPU;
    p->vendorId = 0x8086;
    p->deviceId = 0x0bd5;
#ifdef INTEGRATED
    p->flags = ZE_DEVICE_PROPERTY_FLAG_INTEGRATED;
#endif
    for (int i = 0; i < ZE_MAX_DEVICE_UUID_SIZE; i++) p->uuid.id[i] = (uint8_t)(0xa0 + i);
    strcpy(p->name, "Fake Intel Data Center GPU");
    return ZE_RESULT_SUCCESS;
}
ze_result_t zeDeviceGetMemoryProperties(ze_device_handle_t d, uint32_t *n, ze_device_memory_properties_t *m) {
    if (m && *n >= 1) {
        if (m[0].stype != ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
        m[0].totalSize = TOTAL;
        strcpy(m[0].name, "HBM");
    }
    *n = 1;
    return ZE_RESULT_SUCCESS;
}
ze_result_t zeContextCreate(ze_driver_handle_t d, const ze_context_desc_t *desc, ze_context_handle_t *c) {
    if (desc->stype != ZE_STRUCTURE_TYPE_CONTEXT_DESC) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    contexts++;
    *c = (ze_context_handle_t)&ctx;
    return ZE_RESULT_SUCCESS;
}
ze_result_t zeContextDestroy(ze_context_handle_t c) { contexts--; return ZE_RESULT_SUCCESS; }

/* Allocations carry their size in a small header kept by malloc (never dereferenced by memplan). */
static void *take(size_t size) {
    if (used + size > TOTAL) return NULL;
    unsigned long long *h = malloc(sizeof *h);
    *h = size;
    used += size;
    return h;
}
static void give(void *p) { used -= *(unsigned long long *)p; free(p); }

ze_result_t zeMemAllocDevice(ze_context_handle_t c, const ze_device_mem_alloc_desc_t *d, size_t size, size_t align, ze_device_handle_t dv, void **p) {
    if (d->stype != ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    *p = take(size);
    return *p ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
}
#ifndef NO_MEM_FREE
ze_result_t zeMemFree(ze_context_handle_t c, void *p) { give(p); return ZE_RESULT_SUCCESS; }
#endif
ze_result_t zeVirtualMemQueryPageSize(ze_context_handle_t c, ze_device_handle_t d, size_t s, size_t *page) {
#ifdef NO_VMM
    return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
#endif
    *page = PAGE;
    return ZE_RESULT_SUCCESS;
}
static char address_space[64 * PAGE] __attribute__((aligned(1 << 21)));
ze_result_t zeVirtualMemReserve(ze_context_handle_t c, const void *start, size_t size, void **p) {
    if (size > sizeof address_space) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
    *p = address_space;
    return ZE_RESULT_SUCCESS;
}
ze_result_t zeVirtualMemFree(ze_context_handle_t c, const void *p, size_t s) { return ZE_RESULT_SUCCESS; }
ze_result_t zePhysicalMemCreate(ze_context_handle_t c, ze_device_handle_t d, ze_physical_mem_desc_t *desc, ze_physical_mem_handle_t *h) {
    if (desc->stype != ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC || desc->size % PAGE) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
    *h = take(desc->size);
    return *h ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
}
ze_result_t zePhysicalMemDestroy(ze_context_handle_t c, ze_physical_mem_handle_t h) { give(h); return ZE_RESULT_SUCCESS; }
ze_result_t zeVirtualMemMap(ze_context_handle_t c, const void *p, size_t s, ze_physical_mem_handle_t h, size_t o, ze_memory_access_attribute_t a) {
    return a == ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE && *(unsigned long long *)h == s ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ARGUMENT;
}
ze_result_t zeVirtualMemUnmap(ze_context_handle_t c, const void *p, size_t s) { return ZE_RESULT_SUCCESS; }
ze_result_t zeVirtualMemSetAccessAttribute(ze_context_handle_t c, const void *p, size_t s, ze_memory_access_attribute_t a) { return ZE_RESULT_SUCCESS; }

#ifndef NO_ZES_INIT
ze_result_t zesInit(uint32_t flags) { return ZE_RESULT_SUCCESS; }
ze_result_t zesDriverGet(uint32_t *n, void **d) { return list(n, d, &drv); }
ze_result_t zesDeviceGet(void *d, uint32_t *n, void **o) { return list(n, o, &dev); }
#endif
ze_result_t zesDeviceGetProperties(zes_device_handle_t d, zes_device_properties_t *p) {
    if (p->stype != ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    p->core.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
    return zeDeviceGetProperties((ze_device_handle_t)d, &p->core);
}
ze_result_t zesDeviceEnumMemoryModules(zes_device_handle_t d, uint32_t *n, zes_mem_handle_t *m) {
    if (d != (void *)&dev) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    return list(n, (void **)m, &mem);
}
ze_result_t zesMemoryGetProperties(zes_mem_handle_t m, zes_mem_properties_t *p) {
    if (p->stype != ZES_STRUCTURE_TYPE_MEM_PROPERTIES) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
#ifdef INTEGRATED
    p->location = ZES_MEM_LOC_SYSTEM;
#else
    p->location = ZES_MEM_LOC_DEVICE;
#endif
    p->physicalSize = TOTAL;
    return ZE_RESULT_SUCCESS;
}
ze_result_t zesMemoryGetState(zes_mem_handle_t m, zes_mem_state_t *s) {
    if (s->stype != ZES_STRUCTURE_TYPE_MEM_STATE) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    state_calls++;
    s->size = TOTAL;
#ifdef FREE_EQUALS_TOTAL
    s->free = TOTAL;
#else
    s->free = TOTAL - used;
#endif
    s->health = ZES_MEM_HEALTH_OK;
    return ZE_RESULT_SUCCESS;
}
