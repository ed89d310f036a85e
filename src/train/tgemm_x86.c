/* The AVX2+FMA and AVX-512F levels of the training products (tgemm.h): register tiles of
 * 6 rows x 2 vectors (12 accumulators), each lane one column's fused multiply-add chain
 * over k in order, so the results equal the portable fmaf loop bit for bit. Cache
 * blocking: 96 rows of A (up to ~300 KB at K = 768) stay in L2 while the column panels of
 * B stream past them. Column tails use masked loads and stores; a row tail repeats the
 * tile's first row and drops those results. Compiled on every target, empty off x86. */
#include "train/tgemm.h"

#include "kernels/cpu/cpu.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#define MR 6  /* rows of a register tile */
#define MC 96 /* rows of A per cache block */

#define AVX512 __attribute__((target("avx512f,avx2,fma")))
#define AVX2 __attribute__((target("avx2,fma")))

/* ---- AVX-512F: 6 x 32 ---------------------------------------------------------------- */

AVX512 static void tile512(const tg_gemm *g, uint32_t r, uint32_t rows, uint32_t n, __mmask16 k0, __mmask16 k1) {
    const float *a0 = g->A + (size_t)r * g->lda;
    const float *a1 = rows > 1 ? a0 + g->lda : a0, *a2 = rows > 2 ? a0 + 2 * g->lda : a0;
    const float *a3 = rows > 3 ? a0 + 3 * g->lda : a0, *a4 = rows > 4 ? a0 + 4 * g->lda : a0;
    const float *a5 = rows > 5 ? a0 + 5 * g->lda : a0;
    const float *b = g->B + n;
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (uint32_t k = 0; k < g->K; k++, b += g->ldb) {
        const __m512 b0 = _mm512_maskz_loadu_ps(k0, b), b1 = _mm512_maskz_loadu_ps(k1, b + 16);
        __m512 x = _mm512_set1_ps(a0[k]);
        c00 = _mm512_fmadd_ps(x, b0, c00), c01 = _mm512_fmadd_ps(x, b1, c01);
        x = _mm512_set1_ps(a1[k]);
        c10 = _mm512_fmadd_ps(x, b0, c10), c11 = _mm512_fmadd_ps(x, b1, c11);
        x = _mm512_set1_ps(a2[k]);
        c20 = _mm512_fmadd_ps(x, b0, c20), c21 = _mm512_fmadd_ps(x, b1, c21);
        x = _mm512_set1_ps(a3[k]);
        c30 = _mm512_fmadd_ps(x, b0, c30), c31 = _mm512_fmadd_ps(x, b1, c31);
        x = _mm512_set1_ps(a4[k]);
        c40 = _mm512_fmadd_ps(x, b0, c40), c41 = _mm512_fmadd_ps(x, b1, c41);
        x = _mm512_set1_ps(a5[k]);
        c50 = _mm512_fmadd_ps(x, b0, c50), c51 = _mm512_fmadd_ps(x, b1, c51);
    }
    const __m512 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    for (uint32_t i = 0; i < rows; i++) {
        float *c = g->C + (size_t)(r + i) * g->ldc + n;
        __m512 v0 = acc[i][0], v1 = acc[i][1];
        if (g->accumulate) {
            v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(k0, c), v0);
            v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(k1, c + 16), v1);
        }
        _mm512_mask_storeu_ps(c, k0, v0);
        _mm512_mask_storeu_ps(c + 16, k1, v1);
    }
}

static __mmask16 mask16(uint32_t w) { return w >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1); }

AVX512 static void block512(const tg_gemm *g, uint32_t m0, uint32_t m1, uint32_t n0, uint32_t n1) {
    for (uint32_t mb = m0; mb < m1; mb += MC) {
        const uint32_t me = m1 - mb < MC ? m1 : mb + MC;
        for (uint32_t n = n0; n < n1; n += 32) {
            const uint32_t w = n1 - n < 32 ? n1 - n : 32;
            const __mmask16 k0 = mask16(w), k1 = w > 16 ? mask16(w - 16) : 0;
            for (uint32_t r = mb; r < me; r += MR) tile512(g, r, me - r < MR ? me - r : MR, n, k0, k1);
        }
    }
}

/* ---- AVX2+FMA: 6 x 16 ------------------------------------------------------------------ */

AVX2 static __m256i mask8(uint32_t w) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(w > 8 ? 8 : w)), idx);
}

AVX2 static void tile256(const tg_gemm *g, uint32_t r, uint32_t rows, uint32_t n, __m256i k0, __m256i k1) {
    const float *a0 = g->A + (size_t)r * g->lda;
    const float *a1 = rows > 1 ? a0 + g->lda : a0, *a2 = rows > 2 ? a0 + 2 * g->lda : a0;
    const float *a3 = rows > 3 ? a0 + 3 * g->lda : a0, *a4 = rows > 4 ? a0 + 4 * g->lda : a0;
    const float *a5 = rows > 5 ? a0 + 5 * g->lda : a0;
    const float *b = g->B + n;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (uint32_t k = 0; k < g->K; k++, b += g->ldb) {
        const __m256 b0 = _mm256_maskload_ps(b, k0), b1 = _mm256_maskload_ps(b + 8, k1);
        __m256 x = _mm256_broadcast_ss(a0 + k);
        c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(a1 + k);
        c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(a2 + k);
        c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(a3 + k);
        c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(a4 + k);
        c40 = _mm256_fmadd_ps(x, b0, c40), c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(a5 + k);
        c50 = _mm256_fmadd_ps(x, b0, c50), c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    const __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    for (uint32_t i = 0; i < rows; i++) {
        float *c = g->C + (size_t)(r + i) * g->ldc + n;
        __m256 v0 = acc[i][0], v1 = acc[i][1];
        if (g->accumulate) {
            v0 = _mm256_add_ps(_mm256_maskload_ps(c, k0), v0);
            v1 = _mm256_add_ps(_mm256_maskload_ps(c + 8, k1), v1);
        }
        _mm256_maskstore_ps(c, k0, v0);
        _mm256_maskstore_ps(c + 8, k1, v1);
    }
}

AVX2 static void block256(const tg_gemm *g, uint32_t m0, uint32_t m1, uint32_t n0, uint32_t n1) {
    for (uint32_t mb = m0; mb < m1; mb += MC) {
        const uint32_t me = m1 - mb < MC ? m1 : mb + MC;
        for (uint32_t n = n0; n < n1; n += 16) {
            const uint32_t w = n1 - n < 16 ? n1 - n : 16;
            const __m256i k0 = mask8(w), k1 = mask8(w > 8 ? w - 8 : 0);
            for (uint32_t r = mb; r < me; r += MR) tile256(g, r, me - r < MR ? me - r : MR, n, k0, k1);
        }
    }
}

static const tg_level level512 = {"avx512", block512};
static const tg_level level256 = {"avx2", block256};

/* the engine's probes (kernels/cpu) already check the CPU and the OS's register state */
const tg_level *tg_level_avx512(void) { return cpu_kernels_avx512() ? &level512 : NULL; }
const tg_level *tg_level_avx2(void) { return cpu_kernels_avx2() ? &level256 : NULL; }

#else

const tg_level *tg_level_avx512(void) { return NULL; }
const tg_level *tg_level_avx2(void) { return NULL; }

#endif
