/* The AVX2 + FMA + F16C attention kernel (see attn.h).
 *
 * Scores: each cached K row is converted to floats 8 columns at a time (f16 by vcvtph2ps,
 * int8 by sign extension times its group's scale, which is exactly the plain kernel's
 * dequantised value) and multiplied into one accumulator per query head, so a row is read
 * once for two heads, four rows at a time with their dot products reduced together.
 * Softmax: vector max, a polynomial exp (exp_avx2, within a few ulp of expf) and a vector
 * sum. Values: o is built 32 columns at a time in registers over all positions, two query
 * heads per pass, with the softmax weight (and the 1/sum, and an int8 block's one scale)
 * broadcast per position.
 *
 * Then the output gate, o *= sigmoid(gate), with the same exp.
 *
 * An int8 head that does not start on a multiple of 8 columns (so that 8 lanes could
 * straddle two scale groups) takes the plain kernel. On other architectures this file
 * compiles to nothing. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/attn.h"
#include "needle.h"

/* int8 heads up to 8 * ATTN_MAX_BLOCKS columns take the SIMD path */
#define ATTN_MAX_BLOCKS 64

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
/* The accumulator arrays below must be registers: a loop over them that the compiler
 * does not unroll keeps them in stack slots, and every FMA then waits on a store and a
 * reload (that cost this kernel about 3x). */
#define ATTN_UNROLL4 _Pragma("GCC unroll 4")

AVX2_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2_INLINE float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) for x <= 0 (softmax arguments): Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2,
 * a degree-7 polynomial (Cephes' expf coefficients) and 2^n built in the exponent bits.
 * Arguments below -87.3 give about 1e-38 instead of a subnormal or zero, which no sum of
 * softmax weights (the largest is 1) can tell apart. */
AVX2_INLINE __m256 exp_avx2(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                         _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* 8 values of a row from column j as floats; `sc` is the row's scales (int8 only). */
AVX2_INLINE __m256 load8(int32_t type, const void *row, const float *sc, const uint32_t *gi,
                         uint32_t j) {
    if (type == NEEDLE_KV_F32) return _mm256_loadu_ps((const float *)row + j);
    if (type == NEEDLE_KV_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + j)));
    const __m128i b = _mm_loadl_epi64((const __m128i *)((const int8_t *)row + j));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
                         _mm256_set1_ps(sc[gi[j / 8]]));
}

/* One value, the plain kernel's conversion. */
AVX2_INLINE float load1(int32_t type, const void *row, const float *sc, uint32_t col0,
                        uint32_t group, uint32_t j) {
    if (type == NEEDLE_KV_F32) return ((const float *)row)[j];
    if (type == NEEDLE_KV_F16)
        return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(((const uint16_t *)row)[j])));
    return (float)((const int8_t *)row)[j] * sc[(col0 + j) / group];
}

AVX2_INLINE const void *row_at(int32_t type, const void *base, size_t at) {
    if (type == NEEDLE_KV_F32) return (const float *)base + at;
    if (type == NEEDLE_KV_F16) return (const uint16_t *)base + at;
    return (const int8_t *)base + at;
}

/* Rows this far ahead of the one in use are prefetched (attn_kv.cold). A head's slice of
 * a cache row is a few lines every ld elements, a stride the hardware prefetchers do not
 * follow, and a decode step finds the cache cold (the other layers and their weights
 * passed through in between): without it the kernel waited on memory most of the time. */
#define ATTN_AHEAD 12

/* Prefetches columns [c0, c1) of slot `slot` of a K or V head. */
AVX2_INLINE void prefetch_cols(int32_t type, const void *base, size_t ld, uint32_t slot,
                               uint32_t c0, uint32_t c1) {
    const size_t es = type == NEEDLE_KV_F32 ? 4 : type == NEEDLE_KV_F16 ? 2 : 1;
    const uintptr_t at = (uintptr_t)base + ((size_t)slot * ld + c0) * es;
    const uintptr_t end = (uintptr_t)base + ((size_t)slot * ld + c1) * es;
    for (uintptr_t line = at & ~(uintptr_t)63; line < end; line += 64)
        _mm_prefetch((const char *)line, _MM_HINT_T0);
}

/* The four sums of a[0..3] in one vector: hadd twice, then the two 128-bit halves. */
AVX2_INLINE __m128 hsum4x8(const __m256 *a) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* The sum of one vector in hsum4x8's order, ((v0+v1)+(v2+v3)) + ((v4+v5)+(v6+v7)): a
 * position's score is then the same bits whether it falls in a block of four rows or in
 * a run's tail, so how a cache splits positions into runs does not change results. */
AVX2_INLINE float hsum8_as4(__m256 v) {
    const __m256 h = _mm256_hadd_ps(v, v);
    const __m256 h2 = _mm256_hadd_ps(h, h);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)));
}

/* scale * <q, k> over the columns past the last whole 8 (plain order) */
AVX2_INLINE float dot_tail(int32_t type, const float *q, const void *row, const float *sc,
                           const attn_kv *kv, uint32_t hd8, uint32_t hd) {
    float s = 0.0f;
    for (uint32_t j = hd8; j < hd; j++) s += q[j] * load1(type, row, sc, kv->col0, kv->group, j);
    return s;
}

/* w0[p] = scale * <q0, k_p> (and w1 for q1 when NA = 2) over the positions of the runs:
 * blocks of four rows of a run, each 8-column piece of K converted once for both heads,
 * the four dot products reduced together; the rest of a run one row at a time. */
AVX2_INLINE void scores_pair(int32_t type, const attn_kv *kv, const attn_run *runs,
                             uint32_t n_runs, const uint32_t *gi, const float *q0,
                             const float *q1, const int NA, uint32_t hd, float scale,
                             float *w0, float *w1) {
    const uint32_t hd8 = hd & ~7u;
    const __m128 sv = _mm_set1_ps(scale);
    uint32_t n = 0;
    for (uint32_t r = 0; r < n_runs; r++) {
        uint32_t i = 0;
        for (; i + 4 <= runs[r].count; i += 4, n += 4) {
            const uint32_t ahead_end = kv->cold ? i + ATTN_AHEAD + 4 : 0;
            for (uint32_t u = i + ATTN_AHEAD; u < ahead_end && u < runs[r].count; u++)
                prefetch_cols(type, kv->k, kv->ld, runs[r].slot + u, 0, hd);
            const void *row[4];
            const float *sc[4];
            ATTN_UNROLL4
            for (int u = 0; u < 4; u++) {
                const uint32_t slot = runs[r].slot + i + (uint32_t)u;
                row[u] = row_at(type, kv->k, (size_t)slot * kv->ld);
                sc[u] = kv->k_scales ? kv->k_scales + (size_t)slot * kv->scales_ld : NULL;
            }
            __m256 acc0[4], acc1[4];
            ATTN_UNROLL4
            for (int u = 0; u < 4; u++) acc0[u] = acc1[u] = _mm256_setzero_ps();
            for (uint32_t j = 0; j < hd8; j += 8) {
                const __m256 qa = _mm256_loadu_ps(q0 + j);
                const __m256 qb = NA > 1 ? _mm256_loadu_ps(q1 + j) : qa;
                ATTN_UNROLL4
                for (int u = 0; u < 4; u++) {
                    const __m256 k8 = load8(type, row[u], sc[u], gi, j);
                    acc0[u] = _mm256_fmadd_ps(qa, k8, acc0[u]);
                    if (NA > 1) acc1[u] = _mm256_fmadd_ps(qb, k8, acc1[u]);
                }
            }
            __m128 s0 = hsum4x8(acc0), s1 = NA > 1 ? hsum4x8(acc1) : s0;
            if (hd8 < hd) {
                float t0[4], t1[4];
                ATTN_UNROLL4
                for (int u = 0; u < 4; u++) {
                    t0[u] = dot_tail(type, q0, row[u], sc[u], kv, hd8, hd);
                    t1[u] = NA > 1 ? dot_tail(type, q1, row[u], sc[u], kv, hd8, hd) : 0.0f;
                }
                s0 = _mm_add_ps(s0, _mm_loadu_ps(t0));
                if (NA > 1) s1 = _mm_add_ps(s1, _mm_loadu_ps(t1));
            }
            _mm_storeu_ps(w0 + n, _mm_mul_ps(s0, sv));
            if (NA > 1) _mm_storeu_ps(w1 + n, _mm_mul_ps(s1, sv));
        }
        for (; i < runs[r].count; i++, n++) {
            const uint32_t slot = runs[r].slot + i;
            const void *row = row_at(type, kv->k, (size_t)slot * kv->ld);
            const float *sc = kv->k_scales ? kv->k_scales + (size_t)slot * kv->scales_ld : NULL;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            for (uint32_t j = 0; j < hd8; j += 8) {
                const __m256 k8 = load8(type, row, sc, gi, j);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + j), k8, a0);
                if (NA > 1) a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + j), k8, a1);
            }
            w0[n] = (hsum8_as4(a0) + dot_tail(type, q0, row, sc, kv, hd8, hd)) * scale;
            if (NA > 1)
                w1[n] = (hsum8_as4(a1) + dot_tail(type, q1, row, sc, kv, hd8, hd)) * scale;
        }
    }
}

/* w := exp(w - max w) over n positions; returns 1 / sum. */
AVX2_INLINE float softmax_row(float *w, uint32_t n) {
    const uint32_t n8 = n & ~7u;
    float mx = w[0];
    if (n8) {
        __m256 m = _mm256_loadu_ps(w);
        for (uint32_t i = 8; i < n8; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(w + i));
        mx = hmax8(m);
    }
    for (uint32_t i = n8; i < n; i++) mx = w[i] > mx ? w[i] : mx;
    const __m256 mv = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    for (uint32_t i = 0; i < n8; i += 8) {
        const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(w + i), mv));
        _mm256_storeu_ps(w + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float s = hsum8(sum);
    if (n > n8) {
        float t[8] = {0};
        memcpy(t, w + n8, (n - n8) * sizeof *t);
        const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(t), mv));
        _mm256_storeu_ps(t, e);
        for (uint32_t i = n8; i < n; i++) {
            w[i] = t[i - n8];
            s += w[i];
        }
    }
    return 1.0f / s;
}

/* o[a][c0, c0 + 8*nc) = sum_p w[a][p] * inv[a] * v_p for heads a0, a0 + 1 (na <= 2),
 * nc <= 4 vectors of 8 columns held in registers across all positions. */
AVX2_INLINE void values_block(int32_t type, const attn_kv *kv, const attn_run *runs,
                              uint32_t n_runs, const uint32_t *gi, uint32_t a0, uint32_t na, uint32_t c0,
                              uint32_t nc, uint32_t hd, const float *w, size_t ld_w,
                              const float *inv, float *o) {
    __m256 acc[2][4];
    ATTN_UNROLL4
    for (uint32_t a = 0; a < 2; a++)
        ATTN_UNROLL4
        for (uint32_t c = 0; c < 4; c++) acc[a][c] = _mm256_setzero_ps();
    const float *w0 = w + (size_t)a0 * ld_w, *w1 = w0 + ld_w;
    const int one_group = type == NEEDLE_KV_INT8 && gi[c0 / 8] == gi[c0 / 8 + nc - 1];
    uint32_t n = 0;
    for (uint32_t r = 0; r < n_runs; r++)
        for (uint32_t i = 0; i < runs[r].count; i++, n++) {
            const uint32_t slot = runs[r].slot + i;
            if (kv->cold && i + ATTN_AHEAD < runs[r].count)
                prefetch_cols(type, kv->v, kv->ld, slot + ATTN_AHEAD, c0, c0 + 8 * nc);
            const void *row = row_at(type, kv->v, (size_t)slot * kv->ld);
            const float *sc = kv->v_scales ? kv->v_scales + (size_t)slot * kv->scales_ld : NULL;
            if (type == NEEDLE_KV_INT8 && one_group) {
                /* the block's one scale goes into the weights: raw integers below */
                const float g = sc[gi[c0 / 8]];
                const __m256 c0v = _mm256_set1_ps(w0[n] * inv[0] * g);
                const __m256 c1v = _mm256_set1_ps(na > 1 ? w1[n] * inv[1] * g : 0.0f);
                ATTN_UNROLL4
                for (uint32_t c = 0; c < 4; c++) {
                    if (c >= nc) break;
                    const __m128i b = _mm_loadl_epi64(
                        (const __m128i *)((const int8_t *)row + c0 + 8 * c));
                    const __m256 v8 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
                    acc[0][c] = _mm256_fmadd_ps(c0v, v8, acc[0][c]);
                    if (na > 1) acc[1][c] = _mm256_fmadd_ps(c1v, v8, acc[1][c]);
                }
                continue;
            }
            const __m256 c0v = _mm256_set1_ps(w0[n] * inv[0]);
            const __m256 c1v = _mm256_set1_ps(na > 1 ? w1[n] * inv[1] : 0.0f);
            ATTN_UNROLL4
            for (uint32_t c = 0; c < 4; c++) {
                if (c >= nc) break;
                const __m256 v8 = load8(type, row, sc, gi, c0 + 8 * c);
                acc[0][c] = _mm256_fmadd_ps(c0v, v8, acc[0][c]);
                if (na > 1) acc[1][c] = _mm256_fmadd_ps(c1v, v8, acc[1][c]);
            }
        }
    ATTN_UNROLL4
    for (uint32_t a = 0; a < 2; a++)
        ATTN_UNROLL4
        for (uint32_t c = 0; c < 4; c++)
            if (a < na && c < nc)
                _mm256_storeu_ps(o + (size_t)(a0 + a) * hd + c0 + 8 * c, acc[a][c]);
}

AVX2_INLINE void attend_typed(int32_t type, const attn_kv *kv, const attn_run *runs,
                              uint32_t n_runs, const float *q, uint32_t nq, uint32_t hd,
                              float scale, float *w, size_t ld_w, float *o) {
    const uint32_t vd = attn_v_dim(kv, hd), v_col0 = attn_v_col0(kv);
    /* int8: the scale group of each 8-column block of K (gi) and of V (gv) (a division
     * per block costs more than the block's arithmetic) */
    uint32_t gi[ATTN_MAX_BLOCKS], gv[ATTN_MAX_BLOCKS];
    if (type == NEEDLE_KV_INT8) {
        for (uint32_t j = 0; j + 8 <= hd; j += 8) gi[j / 8] = (kv->col0 + j) / kv->group;
        for (uint32_t j = 0; j + 8 <= vd; j += 8) gv[j / 8] = (v_col0 + j) / kv->group;
    }
    uint32_t n = 0;
    for (uint32_t r = 0; r < n_runs; r++) n += runs[r].count;
    for (uint32_t a0 = 0; a0 < nq; a0 += 2) {
        const float *q0 = q + (size_t)a0 * hd;
        float *w0 = w + (size_t)a0 * ld_w;
        if (nq - a0 >= 2)
            scores_pair(type, kv, runs, n_runs, gi, q0, q0 + hd, 2, hd, scale, w0, w0 + ld_w);
        else
            scores_pair(type, kv, runs, n_runs, gi, q0, NULL, 1, hd, scale, w0, NULL);
    }
    const uint32_t vd8 = vd & ~7u;
    for (uint32_t a0 = 0; a0 < nq; a0 += 2) {
        const uint32_t na = nq - a0 < 2 ? nq - a0 : 2;
        float inv[2] = {0.0f, 0.0f};
        for (uint32_t a = 0; a < na; a++) inv[a] = softmax_row(w + (size_t)(a0 + a) * ld_w, n);
        for (uint32_t c0 = 0; c0 < vd8; c0 += 32) {
            const uint32_t nc = (vd8 - c0) / 8 < 4 ? (vd8 - c0) / 8 : 4;
            if (na == 2 && nc == 4) /* the common shape, specialised */
                values_block(type, kv, runs, n_runs, gv, a0, 2, c0, 4, vd, w, ld_w, inv, o);
            else
                values_block(type, kv, runs, n_runs, gv, a0, na, c0, nc, vd, w, ld_w, inv, o);
        }
        for (uint32_t j = vd8; j < vd; j++)
            for (uint32_t a = 0; a < na; a++) {
                const float *wa = w + (size_t)(a0 + a) * ld_w;
                float acc = 0.0f;
                uint32_t p = 0;
                for (uint32_t r = 0; r < n_runs; r++)
                    for (uint32_t i = 0; i < runs[r].count; i++, p++) {
                        const uint32_t slot = runs[r].slot + i;
                        const void *row = row_at(type, kv->v, (size_t)slot * kv->ld);
                        const float *sc =
                            kv->v_scales ? kv->v_scales + (size_t)slot * kv->scales_ld : NULL;
                        acc += wa[p] * inv[a] * load1(type, row, sc, v_col0, kv->group, j);
                    }
                o[(size_t)(a0 + a) * vd + j] = acc;
            }
    }
}

/* o[i] *= sigmoid(g[i]) = 1 / (1 + exp(-g)), exp's argument clamped to where 2^n is a
 * finite float (beyond it the sigmoid is 0 or 1 to float precision anyway). */
AVX2_INLINE void gate_avx2(float *o, const float *g, uint32_t n) {
    uint32_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), hi = _mm256_set1_ps(88.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 z = _mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(g + i)), hi);
        const __m256 sg = _mm256_div_ps(one, _mm256_add_ps(one, exp_avx2(z)));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(o + i), sg));
    }
    for (; i < n; i++) o[i] *= 1.0f / (1.0f + expf(-g[i]));
}

AVX2_FN void attn_avx2(const attn_kv *kv, const attn_run *runs, uint32_t n_runs,
                                const float *q, uint32_t nq, uint32_t hd, float scale,
                                const float *gate, float *w, size_t ld_w, float *o, float *tmp) {
    switch (kv->type) {
    case NEEDLE_KV_F32:
        attend_typed(NEEDLE_KV_F32, kv, runs, n_runs, q, nq, hd, scale, w, ld_w, o);
        break;
    case NEEDLE_KV_F16:
        attend_typed(NEEDLE_KV_F16, kv, runs, n_runs, q, nq, hd, scale, w, ld_w, o);
        break;
    default:
        if (kv->col0 % 8 || attn_v_col0(kv) % 8 || kv->group % 8 || hd / 8 > ATTN_MAX_BLOCKS ||
            attn_v_dim(kv, hd) / 8 > ATTN_MAX_BLOCKS) {
            attn_plain(kv, runs, n_runs, q, nq, hd, scale, NULL, w, ld_w, o, tmp);
            break;
        }
        attend_typed(NEEDLE_KV_INT8, kv, runs, n_runs, q, nq, hd, scale, w, ld_w, o);
    }
    if (gate) gate_avx2(o, gate, nq * attn_v_dim(kv, hd));
}

#else

/* ISO C forbids an empty translation unit */
typedef int attn_avx2_unavailable;

#endif
