/* The NEON Needle 3 kernels (see monarch.h) on little-endian aarch64: as the AVX2 ones
 * (monarch_avx2.c), an output row built in registers, up to 32 columns (8 vectors of 4)
 * at a time, over all the rows it combines; columns past the last whole 4 in scalar. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/monarch.h"
#include "kernels/cpu/neon.h"

#if NEEDLE_NEON

static inline __attribute__((always_inline)) void
combine_block(float *out, const float *c, size_t c_ld, const float *x, uint32_t n, uint32_t w,
              uint32_t l0, const uint32_t NV) {
    float32x4_t acc[8];
    for (uint32_t v = 0; v < NV; v++) acc[v] = vdupq_n_f32(0.0f);
    for (uint32_t r = 0; r < n; r++) {
        const float cr = c[(size_t)r * c_ld];
        const float *xr = x + (size_t)r * w + l0;
        for (uint32_t v = 0; v < NV; v++) acc[v] = vfmaq_n_f32(acc[v], vld1q_f32(xr + 4 * v), cr);
    }
    for (uint32_t v = 0; v < NV; v++) vst1q_f32(out + l0 + 4 * v, acc[v]);
}

static void combine_neon(float *out, const float *c, size_t c_ld, const float *x, uint32_t n,
                         uint32_t w) {
    const uint32_t w4 = w & ~3u;
    uint32_t l0 = 0;
    for (; l0 + 32 <= w4; l0 += 32) combine_block(out, c, c_ld, x, n, w, l0, 8);
    if (l0 + 16 <= w4) {
        combine_block(out, c, c_ld, x, n, w, l0, 4);
        l0 += 16;
    }
    for (; l0 < w4; l0 += 4) combine_block(out, c, c_ld, x, n, w, l0, 1);
    for (uint32_t l = w4; l < w; l++) {
        float acc = 0.0f;
        for (uint32_t r = 0; r < n; r++) acc = fmaf(c[(size_t)r * c_ld], x[(size_t)r * w + l], acc);
        out[l] = acc;
    }
}

static void mul_add_neon(float *out, const float *a, const float *b, uint32_t n) {
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(out + i, vfmaq_f32(vld1q_f32(out + i), vld1q_f32(a + i), vld1q_f32(b + i)));
    for (; i < n; i++) out[i] = fmaf(a[i], b[i], out[i]);
}

static void combine_rows_neon(float *out, size_t out_ld, const float *c, size_t c_row,
                              size_t c_ld, const float *x, uint32_t n, uint32_t w, uint32_t m) {
    for (uint32_t i = 0; i < m; i++)
        combine_neon(out + (size_t)i * out_ld, c + (size_t)i * c_row, c_ld, x, n, w);
}

static const monarch_kernels table = {"neon", combine_neon, mul_add_neon, combine_rows_neon};

const monarch_kernels *monarch_kernels_neon(void) { return cpu_kernels_neon() ? &table : NULL; }

#else

const monarch_kernels *monarch_kernels_neon(void) { return NULL; }

#endif
