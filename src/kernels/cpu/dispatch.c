/* Kernel-level selection for the CPU backend (see cpu.h): the plain table, the CPU probe
 * and NEEDLE_CPU. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "needle.h"
#include "util/error.h"

static void plain_matmul(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr,
                         size_t ld_x, uint32_t ntok, float *y, size_t ld_y,
                         cq_scratch *scratch) {
    (void)scratch;
    cq_matmul(w, row0, nrows, xr, ld_x, ntok, y, ld_y);
}

static float plain_dot(const float *a, const float *b, uint32_t n) {
    float acc = 0.0f;
    for (uint32_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void plain_axpy(float *y, float a, const float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] += a * x[i];
}

const cpu_kernels cpu_kernels_scalar = {
    .name = "scalar",
    .fwht = fwht,
    .rotate = cq_rotate,
    .matmul = plain_matmul,
    .dequant_row = cq_dequant_row,
    .dot = plain_dot,
    .axpy = plain_axpy,
    .attend = attn_plain,
};

size_t cq_scratch_floats(uint32_t cols_pad, uint32_t ntok) {
    /* permuted activations of every token, then a panel of decoded weight rows (12 are
     * used: cq_gemm_avx2.c, cq_gemm_avx512.c); at the AMX level the tokens as bf16 tiles
     * (ntok rounded up to 16 rows' worth), a decoded row and a panel's bf16 halves (16
     * rows' worth; cq_gemm_amx.c); alignment slack */
    return ((size_t)ntok + 32) * cols_pad + 80;
}

const char *cpu_kernels_vector_level(const cpu_kernels *k) {
    return strcmp(k->name, "amx") ? k->name : "avx512";
}

const cpu_kernels *cpu_kernels_named(const char *name) {
    if (!name) return NULL;
    if (!strcmp(name, "scalar")) return &cpu_kernels_scalar;
    if (!strcmp(name, "avx2")) return cpu_kernels_avx2();
    if (!strcmp(name, "avx512")) return cpu_kernels_avx512();
    if (!strcmp(name, "amx")) return cpu_kernels_amx();
    if (!strcmp(name, "neon")) return cpu_kernels_neon();
    if (!strcmp(name, "simd128")) return cpu_kernels_simd128();
    return NULL;
}

int cpu_check_env(void) {
    const char *want = getenv("NEEDLE_CPU");
    if (want && *want) {
        const int named = !strcmp(want, "scalar") || !strcmp(want, "avx2") ||
                          !strcmp(want, "avx512") || !strcmp(want, "amx") ||
                          !strcmp(want, "neon") || !strcmp(want, "simd128");
        if (!named)
            return needle_fail(NEEDLE_ERR_BACKEND, "NEEDLE_CPU=%.40s is not a kernel level "
                               "(scalar, avx2, avx512, amx, neon, simd128)", want);
        if (!cpu_kernels_named(want))
            return needle_fail(NEEDLE_ERR_BACKEND, "NEEDLE_CPU=%s: this CPU or build has no "
                               "%s kernels (scalar always works)", want, want);
    }
    const char *threads = getenv("NEEDLE_THREADS");
    if (threads && *threads) {
        char *end;
        errno = 0;
        const long v = strtol(threads, &end, 10);
        if (*end || end == threads || errno || v < 1)
            return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "NEEDLE_THREADS=%.40s is not a "
                               "positive integer", threads);
    }
    return NEEDLE_OK;
}

static const cpu_kernels *best;
static pthread_once_t best_once = PTHREAD_ONCE_INIT;

static void pick_best(void) {
    const cpu_kernels *k = cpu_kernels_amx();
    if (!k) k = cpu_kernels_avx512();
    if (!k) k = cpu_kernels_avx2();
    if (!k) k = cpu_kernels_neon();
    if (!k) k = cpu_kernels_simd128();
    if (!k) k = &cpu_kernels_scalar;
    /* NEEDLE_CPU lowers the level; one this CPU lacks (cpu_check_env refuses it when a
     * model is opened) leaves the best */
    const char *want = getenv("NEEDLE_CPU");
    const cpu_kernels *named = want && *want ? cpu_kernels_named(want) : NULL;
    if (named) k = named;
    best = k;
}

const cpu_kernels *cpu_kernels_best(void) {
    pthread_once(&best_once, pick_best);
    return best;
}
