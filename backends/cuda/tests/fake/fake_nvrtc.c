/*
 * A fake nvrtc (soname libnvrtc.so) for memplan's tests: checks that it is asked to compile
 * memplan's kernel for one --gpu-architecture=compute_XY, and returns PTX that the fake driver
 * accepts, or (when FAKE_NVRTC_BAD_PTX is set) PTX without the kernel, which the fake driver
 * rejects as CUDA_ERROR_INVALID_PTX so that the backend falls back to its embedded PTX.
 */
#include <stdlib.h>
#include <string.h>

#define OK 0
#define E_INVALID_INPUT 3
#define E_INVALID_PROGRAM 4
#define E_INVALID_OPTION 5

static int programs, compiles;
static char arch[64];
typedef struct { char ptx[256]; int compiled; } prog_t;

long long fake_nvrtc_state(const char *key) {
    if (!strcmp(key, "programs")) return programs;
    if (!strcmp(key, "compiles")) return compiles;
    if (!strcmp(key, "arch")) return atoi(arch);
    return -1;
}

int nvrtcCreateProgram(void **prog, const char *src, const char *name, int n, const char *const *h, const char *const *i) {
    (void)name; (void)h; (void)i;
    if (!src || !strstr(src, "memplan_touch") || n != 0) return E_INVALID_INPUT;
    prog_t *p = calloc(1, sizeof *p);
    if (!p) return 1;
    programs++; *prog = p;
    return OK;
}
int nvrtcCompileProgram(void *prog, int n, const char *const *opts) {
    prog_t *p = prog;
    const char *pre = "--gpu-architecture=compute_";
    if (!p) return E_INVALID_PROGRAM;
    if (n != 1 || strncmp(opts[0], pre, strlen(pre))) return E_INVALID_OPTION;
    strncpy(arch, opts[0] + strlen(pre), sizeof arch - 1);
    compiles++; p->compiled = 1;
    strcpy(p->ptx, getenv("FAKE_NVRTC_BAD_PTX") ? "// nothing here\n"
                                                 : ".version 8.0\n.target sm_89\n.visible .entry memplan_touch()\n{\n ret;\n}\n");
    return OK;
}
int nvrtcGetPTXSize(void *prog, size_t *n) { prog_t *p = prog; if (!p || !p->compiled) return E_INVALID_PROGRAM; *n = strlen(p->ptx) + 1; return OK; }
int nvrtcGetPTX(void *prog, char *out) { prog_t *p = prog; if (!p || !p->compiled) return E_INVALID_PROGRAM; strcpy(out, p->ptx); return OK; }
int nvrtcGetProgramLogSize(void *prog, size_t *n) { (void)prog; *n = 1; return OK; }
int nvrtcGetProgramLog(void *prog, char *log) { (void)prog; log[0] = 0; return OK; }
int nvrtcDestroyProgram(void **prog) { if (!prog || !*prog) return E_INVALID_PROGRAM; free(*prog); *prog = NULL; programs--; return OK; }
