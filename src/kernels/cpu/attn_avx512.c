/* The AVX-512F one-token attention kernel (see attn.h): a decode step's query heads
 * against one K/V head of an f32 or f16 cache, 16 columns per vector.
 *
 * Why it beats the AVX2 kernel on Needle 3 (6 query heads per K/V head, qk 48, v 64):
 * the AVX2 kernel reads K once per pair of heads and V once per pair of heads and 32
 * columns; here every key row is read once for up to 6 heads (4 positions x 6 heads =
 * 24 accumulators), and every value row once for up to 6 heads and 64 columns (24
 * accumulators), with half as many FMAs at twice the width.
 *
 * Shapes it takes: f32 or f16 caches with hd and vd multiples of 16; anything else
 * (int8 caches, other widths) goes to attn_avx2, whose result it then is.
 *
 * Arithmetic: scores per position as 16-lane partial dot products reduced by one fixed
 * tree whether or not the position is in a block of four (so a score depends only on the
 * query and the key, not on how the positions are split into runs), the softmax with a polynomial exp (the AVX2 kernel's, 16 lanes), values summed
 * in position order per output; the order differs from the plain and AVX2 kernels, so
 * results agree with them to float rounding and depend only on the inputs. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/attn.h"
#include "needle.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx2,fma,f16c")))
#define AVX512_FN __attribute__((target("avx512f,avx2,fma,f16c")))

/* Query heads per pass over the cache: 4 positions x 6 heads of score accumulators, or
 * 6 heads x 4 vectors of value accumulators, fit the 32 registers with the loads. */
#define HEADS_MAX 6

/* exp(x) for x <= 0: exp_avx2's reduction and polynomial on 16 lanes. */
AVX512_INLINE __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* 16 values of a row from column j as floats. */
AVX512_INLINE __m512 load16(int32_t type, const void *row, uint32_t j) {
    if (type == NEEDLE_KV_F32) return _mm512_loadu_ps((const float *)row + j);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + j)));
}

AVX512_INLINE const void *row_at(int32_t type, const void *base, size_t at) {
    if (type == NEEDLE_KV_F32) return (const float *)base + at;
    return (const uint16_t *)base + at;
}

/* Rows this far ahead of the one in use are prefetched when the cache is cold
 * (attn_kv.cold, a decode step: as attn_avx2 explains, a head's slice of each row is a
 * few lines every ld elements, which the hardware prefetchers do not follow). */
#define ATTN_AHEAD 12

/* Prefetches columns [0, cols) of slot `slot` of a K or V head. */
AVX512_INLINE void prefetch_row(int32_t type, const void *base, size_t ld, uint32_t slot,
                                uint32_t cols) {
    const size_t es = type == NEEDLE_KV_F32 ? 4 : 2;
    const uintptr_t at = (uintptr_t)base + (size_t)slot * ld * es;
    for (uintptr_t line = at & ~(uintptr_t)63; line < at + cols * es; line += 64)
        _mm_prefetch((const char *)line, _MM_HINT_T0);
}

/* The sums of a, b, c, d as lanes 0..3 (a fixed tree). */
AVX512_INLINE __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
#define HALF(v) _mm256_add_ps(_mm512_castps512_ps256(v), \
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
    const __m256 ab = _mm256_hadd_ps(HALF(a), HALF(b)), cd = _mm256_hadd_ps(HALF(c), HALF(d));
#undef HALF
    const __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* w[a][p] = scale * <q[a], k_p> for heads a < NA over the positions of the runs: four
 * positions at a time, each 16-column piece of K read once for every head. */
AVX512_INLINE void scores_heads(int32_t type, const attn_kv *kv, const attn_run *runs,
                                uint32_t n_runs, const float *q, uint32_t hd, float scale,
                                float *w, size_t ld_w, const int NA) {
    const __m128 sv = _mm_set1_ps(scale);
    uint32_t n = 0;
    for (uint32_t r = 0; r < n_runs; r++) {
        uint32_t i = 0;
        for (; i + 4 <= runs[r].count; i += 4, n += 4) {
            if (kv->cold)
                for (uint32_t u = i + ATTN_AHEAD; u < i + ATTN_AHEAD + 4 && u < runs[r].count; u++)
                    prefetch_row(type, kv->k, kv->ld, runs[r].slot + u, hd);
            const void *row[4];
            for (int u = 0; u < 4; u++)
                row[u] = row_at(type, kv->k, (size_t)(runs[r].slot + i + (uint32_t)u) * kv->ld);
            __m512 acc[HEADS_MAX][4];
            for (int a = 0; a < NA; a++)
                for (int u = 0; u < 4; u++) acc[a][u] = _mm512_setzero_ps();
            for (uint32_t j = 0; j < hd; j += 16) {
                __m512 k16[4];
                for (int u = 0; u < 4; u++) k16[u] = load16(type, row[u], j);
                for (int a = 0; a < NA; a++) {
                    const __m512 qa = _mm512_loadu_ps(q + (size_t)a * hd + j);
                    for (int u = 0; u < 4; u++) acc[a][u] = _mm512_fmadd_ps(qa, k16[u], acc[a][u]);
                }
            }
            for (int a = 0; a < NA; a++)
                _mm_storeu_ps(w + (size_t)a * ld_w + n,
                              _mm_mul_ps(sum4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]), sv));
        }
        for (; i < runs[r].count; i++, n++) {
            const void *row = row_at(type, kv->k, (size_t)(runs[r].slot + i) * kv->ld);
            __m512 acc[HEADS_MAX];
            for (int a = 0; a < NA; a++) acc[a] = _mm512_setzero_ps();
            for (uint32_t j = 0; j < hd; j += 16) {
                const __m512 k16 = load16(type, row, j);
                for (int a = 0; a < NA; a++)
                    acc[a] = _mm512_fmadd_ps(_mm512_loadu_ps(q + (size_t)a * hd + j), k16, acc[a]);
            }
            /* sum4's tree, so a position's score does not depend on whether it falls in
             * a block of four (where runs split, e.g. the per-layer ring's wrap) */
            for (int a = 0; a < NA; a++)
                w[(size_t)a * ld_w + n] =
                    _mm_cvtss_f32(sum4(acc[a], acc[a], acc[a], acc[a])) * scale;
        }
    }
}

/* w := exp(w - max w) over n positions; returns 1 / sum. */
AVX512_INLINE float softmax_row(float *w, uint32_t n) {
    const uint32_t n16 = n & ~15u;
    const __mmask16 tail = (__mmask16)((1u << (n - n16)) - 1u);
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (uint32_t i = 0; i < n16; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(w + i));
    if (tail) m = _mm512_mask_max_ps(m, tail, m, _mm512_maskz_loadu_ps(tail, w + n16));
    const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(m));
    __m512 sum = _mm512_setzero_ps();
    for (uint32_t i = 0; i < n16; i += 16) {
        const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(w + i), mv));
        _mm512_storeu_ps(w + i, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (tail) {
        const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, w + n16), mv));
        _mm512_mask_storeu_ps(w + n16, tail, e);
        sum = _mm512_mask_add_ps(sum, tail, sum, e);
    }
    return 1.0f / _mm512_reduce_add_ps(sum);
}

/* o[a][c0, c0 + 16 NV) = sum_p w[a][p] * inv[a] * v_p for heads a < NA, in position order. */
AVX512_INLINE void values_heads(int32_t type, const attn_kv *kv, const attn_run *runs,
                                uint32_t n_runs, uint32_t c0, const float *w, size_t ld_w,
                                const float *inv, float *o, uint32_t vd, const int NA,
                                const int NV) {
    __m512 acc[HEADS_MAX][4];
    for (int a = 0; a < NA; a++)
        for (int c = 0; c < NV; c++) acc[a][c] = _mm512_setzero_ps();
    uint32_t n = 0;
    for (uint32_t r = 0; r < n_runs; r++)
        for (uint32_t i = 0; i < runs[r].count; i++, n++) {
            if (kv->cold && i + ATTN_AHEAD < runs[r].count)
                prefetch_row(type, (const char *)kv->v + c0 * (type == NEEDLE_KV_F32 ? 4 : 2),
                             kv->ld, runs[r].slot + i + ATTN_AHEAD, 16 * (uint32_t)NV);
            const void *row = row_at(type, kv->v, (size_t)(runs[r].slot + i) * kv->ld);
            __m512 v16[4];
            for (int c = 0; c < NV; c++) v16[c] = load16(type, row, c0 + 16 * (uint32_t)c);
            for (int a = 0; a < NA; a++) {
                const __m512 ca = _mm512_set1_ps(w[(size_t)a * ld_w + n] * inv[a]);
                for (int c = 0; c < NV; c++) acc[a][c] = _mm512_fmadd_ps(ca, v16[c], acc[a][c]);
            }
        }
    for (int a = 0; a < NA; a++)
        for (int c = 0; c < NV; c++)
            _mm512_storeu_ps(o + (size_t)a * vd + c0 + 16 * (uint32_t)c, acc[a][c]);
}

/* Heads [0, NA) of q, w, o (already offset to the group): scores, softmax, values. */
AVX512_INLINE void attend_group(int32_t type, const attn_kv *kv, const attn_run *runs,
                                uint32_t n_runs, uint32_t n, const float *q, uint32_t hd,
                                uint32_t vd, float scale, float *w, size_t ld_w, float *o,
                                const int NA) {
    scores_heads(type, kv, runs, n_runs, q, hd, scale, w, ld_w, NA);
    float inv[HEADS_MAX];
    for (int a = 0; a < NA; a++) inv[a] = softmax_row(w + (size_t)a * ld_w, n);
    uint32_t c0 = 0;
    for (; c0 + 64 <= vd; c0 += 64)
        values_heads(type, kv, runs, n_runs, c0, w, ld_w, inv, o, vd, NA, 4);
    switch ((vd - c0) / 16) {
    case 3: values_heads(type, kv, runs, n_runs, c0, w, ld_w, inv, o, vd, NA, 3); break;
    case 2: values_heads(type, kv, runs, n_runs, c0, w, ld_w, inv, o, vd, NA, 2); break;
    case 1: values_heads(type, kv, runs, n_runs, c0, w, ld_w, inv, o, vd, NA, 1); break;
    default: break;
    }
}

AVX512_INLINE void attend_typed(int32_t type, const attn_kv *kv, const attn_run *runs,
                                uint32_t n_runs, const float *q, uint32_t nq, uint32_t hd,
                                uint32_t vd, float scale, float *w, size_t ld_w, float *o) {
    uint32_t n = 0;
    for (uint32_t r = 0; r < n_runs; r++) n += runs[r].count;
    /* groups of 6 heads, then what is left as 4, 2, 1 */
    for (uint32_t a0 = 0; a0 < nq;) {
        const uint32_t left = nq - a0;
        const uint32_t na = left >= 6 ? 6 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        const float *qa = q + (size_t)a0 * hd;
        float *wa = w + (size_t)a0 * ld_w, *oa = o + (size_t)a0 * vd;
        switch (na) {
        case 6: attend_group(type, kv, runs, n_runs, n, qa, hd, vd, scale, wa, ld_w, oa, 6); break;
        case 4: attend_group(type, kv, runs, n_runs, n, qa, hd, vd, scale, wa, ld_w, oa, 4); break;
        case 2: attend_group(type, kv, runs, n_runs, n, qa, hd, vd, scale, wa, ld_w, oa, 2); break;
        default: attend_group(type, kv, runs, n_runs, n, qa, hd, vd, scale, wa, ld_w, oa, 1); break;
        }
        a0 += na;
    }
}

/* o[i] *= sigmoid(g[i]) = 1 / (1 + exp(-g)), exp's argument clamped to where 2^n is a
 * finite float (as the AVX2 kernel's gate). */
AVX512_INLINE void gate512(float *o, const float *g, uint32_t n) {
    const __m512 one = _mm512_set1_ps(1.0f), hi = _mm512_set1_ps(88.0f);
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 z = _mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_loadu_ps(g + i)), hi);
        const __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, exp512(z)));
        _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_loadu_ps(o + i), sg));
    }
    for (; i < n; i++) o[i] *= 1.0f / (1.0f + expf(-g[i]));
}

AVX512_FN void attn_avx512(const attn_kv *kv, const attn_run *runs, uint32_t n_runs,
                           const float *q, uint32_t nq, uint32_t hd, float scale,
                           const float *gate, float *w, size_t ld_w, float *o, float *tmp) {
    const uint32_t vd = attn_v_dim(kv, hd);
    if ((kv->type != NEEDLE_KV_F32 && kv->type != NEEDLE_KV_F16) || hd % 16 || vd % 16) {
        attn_avx2(kv, runs, n_runs, q, nq, hd, scale, gate, w, ld_w, o, tmp);
        return;
    }
    if (kv->type == NEEDLE_KV_F32)
        attend_typed(NEEDLE_KV_F32, kv, runs, n_runs, q, nq, hd, vd, scale, w, ld_w, o);
    else
        attend_typed(NEEDLE_KV_F16, kv, runs, n_runs, q, nq, hd, vd, scale, w, ld_w, o);
    if (gate) gate512(o, gate, nq * vd);
}

#else

/* ISO C forbids an empty translation unit */
typedef int attn_avx512_unused;

#endif
