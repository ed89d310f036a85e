/* The NEON level of the training products (tgemm.h) on aarch64: register tiles of 6 rows
 * x 16 columns (24 accumulators of 32 registers), each lane one column's fused
 * multiply-add chain over k in order (vfmaq_n_f32 is fused), so the results equal the
 * portable fmaf loop bit for bit. Column tails run the same chain with fmaf; a row tail
 * repeats the tile's first row and drops those results. Empty off aarch64. */
#include "train/tgemm.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>
#include <math.h>

#define MR 6
#define MC 96

static void tile_neon(const tg_gemm *g, uint32_t r, uint32_t rows, uint32_t n) {
    const float *a[MR];
    for (uint32_t i = 0; i < MR; i++) a[i] = g->A + (size_t)(r + (i < rows ? i : 0)) * g->lda;
    float32x4_t c[MR][4];
    for (uint32_t i = 0; i < MR; i++)
        for (uint32_t j = 0; j < 4; j++) c[i][j] = vdupq_n_f32(0.0f);
    const float *b = g->B + n;
    for (uint32_t k = 0; k < g->K; k++, b += g->ldb) {
        const float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4), b2 = vld1q_f32(b + 8), b3 = vld1q_f32(b + 12);
        for (uint32_t i = 0; i < MR; i++) {
            const float x = a[i][k];
            c[i][0] = vfmaq_n_f32(c[i][0], b0, x);
            c[i][1] = vfmaq_n_f32(c[i][1], b1, x);
            c[i][2] = vfmaq_n_f32(c[i][2], b2, x);
            c[i][3] = vfmaq_n_f32(c[i][3], b3, x);
        }
    }
    for (uint32_t i = 0; i < rows; i++) {
        float *cr = g->C + (size_t)(r + i) * g->ldc + n;
        for (uint32_t j = 0; j < 4; j++) {
            float32x4_t v = c[i][j];
            if (g->accumulate) v = vaddq_f32(vld1q_f32(cr + 4 * j), v);
            vst1q_f32(cr + 4 * j, v);
        }
    }
}

static void block_neon(const tg_gemm *g, uint32_t m0, uint32_t m1, uint32_t n0, uint32_t n1) {
    const uint32_t nv = n0 + (n1 - n0) / 16 * 16;
    for (uint32_t mb = m0; mb < m1; mb += MC) {
        const uint32_t me = m1 - mb < MC ? m1 : mb + MC;
        for (uint32_t n = n0; n < nv; n += 16)
            for (uint32_t r = mb; r < me; r += MR) tile_neon(g, r, me - r < MR ? me - r : MR, n);
    }
    for (uint32_t m = m0; m < m1 && nv < n1; m++) /* the column tail: the same chains in fmaf */
        for (uint32_t n = nv; n < n1; n++) {
            float s = 0.0f;
            for (uint32_t k = 0; k < g->K; k++) s = fmaf(g->A[(size_t)m * g->lda + k], g->B[(size_t)k * g->ldb + n], s);
            float *c = g->C + (size_t)m * g->ldc + n;
            *c = g->accumulate ? *c + s : s;
        }
}

static const tg_level level_neon = {"neon", block_neon};

const tg_level *tg_level_neon(void) { return &level_neon; }

#else

const tg_level *tg_level_neon(void) { return NULL; }

#endif
