/* The AVX2+FMA and AVX-512F levels of the training products (tgemm.h): register tiles of
 * 6 rows x 2 vectors (12 accumulators), each lane one column's fused multiply-add chain
 * over k in order, so the results equal the portable fmaf loop bit for bit. Cache
 * blocking: 96 rows of A (up to ~300 KB at K = 768) stay in L2 while the column panels of
 * B, packed 256 rows at a time (see block512), pass over them. Column tails use masked
 * loads and stores; a row tail repeats the tile's first row and drops those results.
 * Compiled on every target, empty off x86. */
#include "train/tgemm.h"

#include "kernels/cpu/cpu.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>
#include <string.h>

#define MR 6  /* rows of a register tile */
#define MC 96 /* rows of A per cache block */

#define AVX512 __attribute__((target("avx512f,avx2,fma")))
#define AVX2 __attribute__((target("avx2,fma")))

/* ---- AVX-512F: 6 x 32, B packed ------------------------------------------------------- */

/* B's 32-column panel is copied, KC rows at a time, into a contiguous buffer that stays in
 * L1 while every 6-row tile of the cache block passes over it: read in place, the panel's
 * rows lie ldb apart, and at the head's ldb of 8192 floats every row maps to the same few
 * L1 sets (the logits ran at ~20 GFLOP/s). The tiles' chains run KC steps at a time; the
 * accumulators are parked in P between the chunks as the floats they are, so each chain is
 * still one fmaf sequence over k from 0 (tgemm.h) and C is written once at the end. */
#define KC 256 /* rows of B per packed chunk: 32 KB, inside a 48 KB L1 */

AVX512 static void pack512(const float *b, size_t ldb, uint32_t kc, __mmask16 k0, __mmask16 k1, float *bp) {
    for (uint32_t k = 0; k < kc; k++, b += ldb, bp += 32) {
        _mm512_store_ps(bp, _mm512_maskz_loadu_ps(k0, b));
        _mm512_store_ps(bp + 16, _mm512_maskz_loadu_ps(k1, b + 16));
    }
}

/* P[rows][32] (+)= the chain of KC steps over a's rows (lda apart) and the packed bp */
AVX512 static void tile512(const float *a0, size_t lda, uint32_t rows, const float *bp, uint32_t kc, float *P,
                           int first) {
    const float *a1 = rows > 1 ? a0 + lda : a0, *a2 = rows > 2 ? a0 + 2 * lda : a0;
    const float *a3 = rows > 3 ? a0 + 3 * lda : a0, *a4 = rows > 4 ? a0 + 4 * lda : a0;
    const float *a5 = rows > 5 ? a0 + 5 * lda : a0;
    __m512 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (first) {
        c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
        c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    } else { /* rows past `rows` hold whatever the tile left there: their results are dropped */
        c00 = _mm512_load_ps(P), c01 = _mm512_load_ps(P + 16), c10 = _mm512_load_ps(P + 32);
        c11 = _mm512_load_ps(P + 48), c20 = _mm512_load_ps(P + 64), c21 = _mm512_load_ps(P + 80);
        c30 = _mm512_load_ps(P + 96), c31 = _mm512_load_ps(P + 112), c40 = _mm512_load_ps(P + 128);
        c41 = _mm512_load_ps(P + 144), c50 = _mm512_load_ps(P + 160), c51 = _mm512_load_ps(P + 176);
    }
    for (uint32_t k = 0; k < kc; k++, bp += 32) {
        const __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
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
    _mm512_store_ps(P, c00), _mm512_store_ps(P + 16, c01), _mm512_store_ps(P + 32, c10);
    _mm512_store_ps(P + 48, c11), _mm512_store_ps(P + 64, c20), _mm512_store_ps(P + 80, c21);
    _mm512_store_ps(P + 96, c30), _mm512_store_ps(P + 112, c31), _mm512_store_ps(P + 128, c40);
    _mm512_store_ps(P + 144, c41), _mm512_store_ps(P + 160, c50), _mm512_store_ps(P + 176, c51);
}

static __mmask16 mask16(uint32_t w) { return w >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1); }

AVX512 static void block512(const tg_gemm *g, uint32_t m0, uint32_t m1, uint32_t n0, uint32_t n1) {
    _Alignas(64) float bp[KC * 32];
    _Alignas(64) float P[MC * 32];
    for (uint32_t mb = m0; mb < m1; mb += MC) {
        const uint32_t me = m1 - mb < MC ? m1 : mb + MC;
        for (uint32_t n = n0; n < n1; n += 32) {
            const uint32_t w = n1 - n < 32 ? n1 - n : 32;
            const __mmask16 k0 = mask16(w), k1 = w > 16 ? mask16(w - 16) : 0;
            if (!g->K) memset(P, 0, sizeof P); /* empty chains: every sum is 0 */
            for (uint32_t kb = 0; kb < g->K; kb += KC) {
                const uint32_t kc = g->K - kb < KC ? g->K - kb : KC;
                pack512(g->B + (size_t)kb * g->ldb + n, g->ldb, kc, k0, k1, bp);
                for (uint32_t r = mb; r < me; r += MR)
                    tile512(g->A + (size_t)r * g->lda + kb, g->lda, me - r < MR ? me - r : MR, bp, kc,
                            P + (size_t)(r - mb) * 32, kb == 0);
            }
            for (uint32_t r = mb; r < me; r++) {
                float *c = g->C + (size_t)r * g->ldc + n;
                const float *p = P + (size_t)(r - mb) * 32;
                __m512 v0 = _mm512_load_ps(p), v1 = _mm512_load_ps(p + 16);
                if (g->accumulate) {
                    v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(k0, c), v0);
                    v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(k1, c + 16), v1);
                }
                _mm512_mask_storeu_ps(c, k0, v0);
                _mm512_mask_storeu_ps(c + 16, k1, v1);
            }
        }
    }
}

/* ---- AVX2+FMA: 6 x 16 ------------------------------------------------------------------ */

AVX2 static __m256i mask8(uint32_t w) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(w > 8 ? 8 : w)), idx);
}

/* B's 16-column panel is packed KC rows at a time (16 KB, inside a 32 KB L1) for the reason
 * given at pack512: read in place at ldb 768 the panel's rows share a few L1 sets (47
 * GFLOP/s against 93 at ldb 96 on one Zen core), at the head's 8192 far worse (16). The
 * chains run KC steps at a time with the accumulators parked in P, as in block512. */
AVX2 static void pack256(const float *b, size_t ldb, uint32_t kc, uint32_t w, __m256i k0, __m256i k1, float *bp) {
    if (w == 16)
        for (uint32_t k = 0; k < kc; k++, b += ldb, bp += 16) {
            _mm256_store_ps(bp, _mm256_loadu_ps(b));
            _mm256_store_ps(bp + 8, _mm256_loadu_ps(b + 8));
        }
    else
        for (uint32_t k = 0; k < kc; k++, b += ldb, bp += 16) {
            _mm256_store_ps(bp, _mm256_maskload_ps(b, k0));
            _mm256_store_ps(bp + 8, _mm256_maskload_ps(b + 8, k1));
        }
}

/* P[rows][16] (+)= the chain of KC steps over a's rows (lda apart) and the packed bp */
AVX2 static void tile256(const float *a0, size_t lda, uint32_t rows, const float *bp, uint32_t kc, float *P,
                         int first) {
    const float *a1 = rows > 1 ? a0 + lda : a0, *a2 = rows > 2 ? a0 + 2 * lda : a0;
    const float *a3 = rows > 3 ? a0 + 3 * lda : a0, *a4 = rows > 4 ? a0 + 4 * lda : a0;
    const float *a5 = rows > 5 ? a0 + 5 * lda : a0;
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (first) {
        c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
        c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    } else { /* rows past `rows` hold whatever the tile left there: their results are dropped */
        c00 = _mm256_load_ps(P), c01 = _mm256_load_ps(P + 8), c10 = _mm256_load_ps(P + 16);
        c11 = _mm256_load_ps(P + 24), c20 = _mm256_load_ps(P + 32), c21 = _mm256_load_ps(P + 40);
        c30 = _mm256_load_ps(P + 48), c31 = _mm256_load_ps(P + 56), c40 = _mm256_load_ps(P + 64);
        c41 = _mm256_load_ps(P + 72), c50 = _mm256_load_ps(P + 80), c51 = _mm256_load_ps(P + 88);
    }
    for (uint32_t k = 0; k < kc; k++, bp += 16) {
        const __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
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
    _mm256_store_ps(P, c00), _mm256_store_ps(P + 8, c01), _mm256_store_ps(P + 16, c10);
    _mm256_store_ps(P + 24, c11), _mm256_store_ps(P + 32, c20), _mm256_store_ps(P + 40, c21);
    _mm256_store_ps(P + 48, c30), _mm256_store_ps(P + 56, c31), _mm256_store_ps(P + 64, c40);
    _mm256_store_ps(P + 72, c41), _mm256_store_ps(P + 80, c50), _mm256_store_ps(P + 88, c51);
}

AVX2 static void block256(const tg_gemm *g, uint32_t m0, uint32_t m1, uint32_t n0, uint32_t n1) {
    _Alignas(32) float bp[KC * 16];
    _Alignas(32) float P[MC * 16];
    for (uint32_t mb = m0; mb < m1; mb += MC) {
        const uint32_t me = m1 - mb < MC ? m1 : mb + MC;
        for (uint32_t n = n0; n < n1; n += 16) {
            const uint32_t w = n1 - n < 16 ? n1 - n : 16;
            const __m256i k0 = mask8(w), k1 = mask8(w > 8 ? w - 8 : 0);
            if (!g->K) memset(P, 0, sizeof P); /* empty chains: every sum is 0 */
            for (uint32_t kb = 0; kb < g->K; kb += KC) {
                const uint32_t kc = g->K - kb < KC ? g->K - kb : KC;
                pack256(g->B + (size_t)kb * g->ldb + n, g->ldb, kc, w, k0, k1, bp);
                for (uint32_t r = mb; r < me; r += MR)
                    tile256(g->A + (size_t)r * g->lda + kb, g->lda, me - r < MR ? me - r : MR, bp, kc,
                            P + (size_t)(r - mb) * 16, kb == 0);
            }
            for (uint32_t r = mb; r < me; r++) {
                float *c = g->C + (size_t)r * g->ldc + n;
                const float *p = P + (size_t)(r - mb) * 16;
                __m256 v0 = _mm256_load_ps(p), v1 = _mm256_load_ps(p + 8);
                if (w == 16) {
                    if (g->accumulate) v0 = _mm256_add_ps(_mm256_loadu_ps(c), v0), v1 = _mm256_add_ps(_mm256_loadu_ps(c + 8), v1);
                    _mm256_storeu_ps(c, v0), _mm256_storeu_ps(c + 8, v1);
                    continue;
                }
                if (g->accumulate) {
                    v0 = _mm256_add_ps(_mm256_maskload_ps(c, k0), v0);
                    v1 = _mm256_add_ps(_mm256_maskload_ps(c + 8, k1), v1);
                }
                _mm256_maskstore_ps(c, k0, v0);
                _mm256_maskstore_ps(c + 8, k1, v1);
            }
        }
    }
}

/* ---- the transpose in 8 x 8 register blocks (AVX) ------------------------------------- */

AVX2 static void transpose8(const float *src, size_t lds, float *dst, size_t ldd) {
    const __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lds), r2 = _mm256_loadu_ps(src + 2 * lds);
    const __m256 r3 = _mm256_loadu_ps(src + 3 * lds), r4 = _mm256_loadu_ps(src + 4 * lds);
    const __m256 r5 = _mm256_loadu_ps(src + 5 * lds), r6 = _mm256_loadu_ps(src + 6 * lds);
    const __m256 r7 = _mm256_loadu_ps(src + 7 * lds);
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst + ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
}

AVX2 static void transpose_avx(const float *src, size_t lds, float *dst, size_t ldd, uint32_t rows, uint32_t cols) {
    uint32_t r0 = 0;
    for (; r0 + 8 <= rows; r0 += 8) {
        uint32_t c0 = 0;
        for (; c0 + 8 <= cols; c0 += 8) transpose8(src + (size_t)r0 * lds + c0, lds, dst + (size_t)c0 * ldd + r0, ldd);
        for (uint32_t c = c0; c < cols; c++)
            for (uint32_t r = r0; r < r0 + 8; r++) dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
    }
    for (uint32_t r = r0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++) dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
}

int tg_transpose_x86(const float *src, size_t lds, float *dst, size_t ldd, uint32_t rows, uint32_t cols) {
    if (!cpu_kernels_avx2()) return 0;
    transpose_avx(src, lds, dst, ldd, rows, cols);
    return 1;
}

static const tg_level level512 = {"avx512", block512};
static const tg_level level256 = {"avx2", block256};

/* the engine's probes (kernels/cpu) already check the CPU and the OS's register state */
const tg_level *tg_level_avx512(void) { return cpu_kernels_avx512() ? &level512 : NULL; }
const tg_level *tg_level_avx2(void) { return cpu_kernels_avx2() ? &level256 : NULL; }

#else

const tg_level *tg_level_avx512(void) { return NULL; }
const tg_level *tg_level_avx2(void) { return NULL; }
int tg_transpose_x86(const float *src, size_t lds, float *dst, size_t ldd, uint32_t rows, uint32_t cols) {
    (void)src, (void)lds, (void)dst, (void)ldd, (void)rows, (void)cols;
    return 0;
}

#endif
