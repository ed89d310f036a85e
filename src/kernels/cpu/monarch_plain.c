/* The plain Needle 3 kernels (see monarch.h) and the choice of a table by level. */
#include <string.h>

#include "kernels/cpu/monarch.h"

static void combine_plain(float *out, const float *c, size_t c_ld, const float *x, uint32_t n,
                          uint32_t w) {
    memset(out, 0, w * sizeof *out);
    for (uint32_t r = 0; r < n; r++) {
        const float cr = c[(size_t)r * c_ld], *xr = x + (size_t)r * w;
        for (uint32_t l = 0; l < w; l++) out[l] += cr * xr[l];
    }
}

static void mul_add_plain(float *out, const float *a, const float *b, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) out[i] += a[i] * b[i];
}

static void combine_rows_plain(float *out, size_t out_ld, const float *c, size_t c_row,
                               size_t c_ld, const float *x, uint32_t n, uint32_t w, uint32_t m) {
    for (uint32_t i = 0; i < m; i++)
        combine_plain(out + (size_t)i * out_ld, c + (size_t)i * c_row, c_ld, x, n, w);
}

const monarch_kernels monarch_kernels_scalar = {"scalar", combine_plain, mul_add_plain,
                                                combine_rows_plain};

const monarch_kernels *monarch_kernels_named(const char *name) {
    if (!name) return NULL;
    if (!strcmp(name, "scalar")) return &monarch_kernels_scalar;
    if (!strcmp(name, "avx2")) return monarch_kernels_avx2();
    if (!strcmp(name, "avx512")) return monarch_kernels_avx512();
    if (!strcmp(name, "neon")) return monarch_kernels_neon();
    return NULL;
}
