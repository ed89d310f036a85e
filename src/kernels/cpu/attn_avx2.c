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

/* ---- prefill blocks (attn.h attn_block_avx2) ----------------------------------------
 *
 * The block's tokens sit in the 8 lanes of a vector: Qt holds each query column of the
 * 8 tokens side by side, so a score vector (8 tokens x one key) is a sum over columns of
 * Qt[j] times key element j broadcast: no horizontal sums, and a key row, converted to
 * floats once per tile, serves all tokens and both heads of a pair. The softmax is then
 * per lane (vertical max, exp, sum), and the values are Ot[c] = sum_k P[k] * v_k[c] with
 * the weight vector P[k] of the 8 tokens times v_k[c] broadcast; Ot is written back per
 * token at the end. A key after a token (causal) is masked to weight 0 in that lane. */

/* rows [r0, r0 + nr) of a K or V head as floats, out[u * cols + j] (cols % 8 == 0) */
AVX2_INLINE void block_tile(int32_t type, const void *base, size_t ld, const float *scales,
                            size_t scales_ld, const uint32_t *gi, uint32_t r0, uint32_t nr,
                            uint32_t cols, float *out) {
    for (uint32_t u = 0; u < nr; u++) {
        const void *row = row_at(type, base, (size_t)(r0 + u) * ld);
        const float *sc = scales ? scales + (size_t)(r0 + u) * scales_ld : NULL;
        for (uint32_t j = 0; j < cols; j += 8)
            _mm256_storeu_ps(out + (size_t)u * cols + j, load8(type, row, sc, gi, j));
    }
}

/* lanes (tokens) i with n0 + i < k: key k comes after them */
AVX2_INLINE __m256 block_future(uint32_t k, uint32_t n0) {
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmp_ps(lane, _mm256_set1_ps((float)(k - n0)), _CMP_LT_OQ);
}

AVX2_INLINE void block_store_score(float *st, uint32_t k, uint32_t n0, __m256 acc,
                                   __m256 sv) {
    __m256 s = _mm256_mul_ps(acc, sv);
    if (k > n0) s = _mm256_blendv_ps(s, _mm256_set1_ps(-INFINITY), block_future(k, n0));
    _mm256_storeu_ps(st + (size_t)k * 8, s);
}

/* st[a][k] = scale * <q_a, k_k> for the 8 tokens, heads a < NA, keys [0, nk) */
AVX2_INLINE void block_scores(int32_t type, const attn_kv *kv, const uint32_t *gi,
                              const float *qt, const int NA, uint32_t hd, uint32_t nk,
                              uint32_t n0, float scale, float *tile, float *st, size_t ld_st) {
    const __m256 sv = _mm256_set1_ps(scale);
    for (uint32_t k0 = 0; k0 < nk; k0 += ATTN_BLOCK_KEY_TILE) {
        const uint32_t nr = nk - k0 < ATTN_BLOCK_KEY_TILE ? nk - k0 : ATTN_BLOCK_KEY_TILE;
        const float *kr;
        size_t kld;
        if (type == NEEDLE_KV_F32) {
            kr = (const float *)kv->k + (size_t)k0 * kv->ld;
            kld = kv->ld;
        } else {
            block_tile(type, kv->k, kv->ld, kv->k_scales, kv->scales_ld, gi, k0, nr, hd, tile);
            kr = tile;
            kld = hd;
        }
        uint32_t u = 0;
        for (; u + 4 <= nr; u += 4) {
            __m256 acc0[4], acc1[4];
            ATTN_UNROLL4
            for (int x = 0; x < 4; x++) acc0[x] = acc1[x] = _mm256_setzero_ps();
            const float *r = kr + (size_t)u * kld;
            for (uint32_t j = 0; j < hd; j++) {
                const __m256 qa = _mm256_loadu_ps(qt + (size_t)j * 8);
                const __m256 qb = NA > 1 ? _mm256_loadu_ps(qt + ((size_t)hd + j) * 8) : qa;
                ATTN_UNROLL4
                for (int x = 0; x < 4; x++) {
                    const __m256 kb = _mm256_broadcast_ss(r + (size_t)x * kld + j);
                    acc0[x] = _mm256_fmadd_ps(qa, kb, acc0[x]);
                    if (NA > 1) acc1[x] = _mm256_fmadd_ps(qb, kb, acc1[x]);
                }
            }
            ATTN_UNROLL4
            for (uint32_t x = 0; x < 4; x++) {
                block_store_score(st, k0 + u + x, n0, acc0[x], sv);
                if (NA > 1) block_store_score(st + ld_st, k0 + u + x, n0, acc1[x], sv);
            }
        }
        for (; u < nr; u++) {
            __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
            const float *r = kr + (size_t)u * kld;
            for (uint32_t j = 0; j < hd; j++) {
                const __m256 kb = _mm256_broadcast_ss(r + j);
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(qt + (size_t)j * 8), kb, acc0);
                if (NA > 1)
                    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(qt + ((size_t)hd + j) * 8), kb, acc1);
            }
            block_store_score(st, k0 + u, n0, acc0, sv);
            if (NA > 1) block_store_score(st + ld_st, k0 + u, n0, acc1, sv);
        }
    }
}

/* st := exp(st - max) per lane over keys [0, nk), masked keys 0; inv := 1 / sum */
AVX2_INLINE void block_softmax(float *st, uint32_t nk, uint32_t n0, float *inv) {
    __m256 m = _mm256_loadu_ps(st);
    for (uint32_t k = 1; k < nk; k++) m = _mm256_max_ps(m, _mm256_loadu_ps(st + (size_t)k * 8));
    __m256 sum = _mm256_setzero_ps();
    for (uint32_t k = 0; k < nk; k++) {
        __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(st + (size_t)k * 8), m));
        if (k > n0) e = _mm256_andnot_ps(block_future(k, n0), e);
        _mm256_storeu_ps(st + (size_t)k * 8, e);
        sum = _mm256_add_ps(sum, e);
    }
    _mm256_storeu_ps(inv, _mm256_div_ps(_mm256_set1_ps(1.0f), sum));
}

/* ot[a][c] += sum_k st[a][k] * v_k[c] for heads a < NA, keys [0, nk), columns [0, vd) */
AVX2_INLINE void block_values(int32_t type, const attn_kv *kv, const uint32_t *gv,
                              const int NA, uint32_t vd, uint32_t nk, const float *st,
                              size_t ld_st, float *tile, float *ot) {
    const void *v = kv->v;
    for (uint32_t k0 = 0; k0 < nk; k0 += ATTN_BLOCK_KEY_TILE) {
        const uint32_t nr = nk - k0 < ATTN_BLOCK_KEY_TILE ? nk - k0 : ATTN_BLOCK_KEY_TILE;
        const float *vr;
        size_t vld;
        if (type == NEEDLE_KV_F32) {
            vr = (const float *)v + (size_t)k0 * kv->ld;
            vld = kv->ld;
        } else {
            block_tile(type, v, kv->ld, kv->v_scales, kv->scales_ld, gv, k0, nr, vd, tile);
            vr = tile;
            vld = vd;
        }
        const float *p0 = st + (size_t)k0 * 8, *p1 = p0 + ld_st;
        for (uint32_t c = 0; c < vd; c += 4) {
            __m256 acc0[4], acc1[4];
            ATTN_UNROLL4
            for (uint32_t x = 0; x < 4; x++) {
                acc0[x] = _mm256_loadu_ps(ot + (size_t)(c + x) * 8);
                acc1[x] = NA > 1 ? _mm256_loadu_ps(ot + ((size_t)vd + c + x) * 8) : acc0[x];
            }
            for (uint32_t u = 0; u < nr; u++) {
                const __m256 pa = _mm256_loadu_ps(p0 + (size_t)u * 8);
                const __m256 pb = NA > 1 ? _mm256_loadu_ps(p1 + (size_t)u * 8) : pa;
                const float *r = vr + (size_t)u * vld + c;
                ATTN_UNROLL4
                for (uint32_t x = 0; x < 4; x++) {
                    const __m256 vb = _mm256_broadcast_ss(r + x);
                    acc0[x] = _mm256_fmadd_ps(pa, vb, acc0[x]);
                    if (NA > 1) acc1[x] = _mm256_fmadd_ps(pb, vb, acc1[x]);
                }
            }
            ATTN_UNROLL4
            for (uint32_t x = 0; x < 4; x++) {
                _mm256_storeu_ps(ot + (size_t)(c + x) * 8, acc0[x]);
                if (NA > 1) _mm256_storeu_ps(ot + ((size_t)vd + c + x) * 8, acc1[x]);
            }
        }
    }
}

AVX2_INLINE void block_typed(int32_t type, const attn_kv *kv, uint32_t n0, uint32_t nt,
                             const float *q, size_t ld_q, uint32_t nq, uint32_t hd,
                             float scale, float *o, size_t ld_o, float *scratch) {
    const uint32_t vd = attn_v_dim(kv, hd), nk = n0 + nt;
    const size_t ld_st = (size_t)ATTN_BLOCK_MAX_KEYS * 8;
    float *st = scratch, *tile = st + 2 * ld_st;
    float *qt = tile + (size_t)ATTN_BLOCK_KEY_TILE * (hd > vd ? hd : vd);
    float *ot = qt + 2 * (size_t)hd * 8, *inv = ot + 2 * (size_t)vd * 8;
    uint32_t gi[ATTN_MAX_BLOCKS], gv[ATTN_MAX_BLOCKS];
    if (type == NEEDLE_KV_INT8) {
        for (uint32_t j = 0; j < hd; j += 8) gi[j / 8] = (kv->col0 + j) / kv->group;
        for (uint32_t j = 0; j < vd; j += 8) gv[j / 8] = (attn_v_col0(kv) + j) / kv->group;
    }
    for (uint32_t a0 = 0; a0 < nq; a0 += 2) {
        const uint32_t na = nq - a0 < 2 ? nq - a0 : 2;
        /* the lanes of tokens past nt hold zero queries: finite scores, outputs unused */
        for (uint32_t a = 0; a < na; a++)
            for (uint32_t j = 0; j < hd; j++)
                for (uint32_t i = 0; i < 8; i++)
                    qt[((size_t)a * hd + j) * 8 + i] =
                        i < nt ? q[i * ld_q + (size_t)(a0 + a) * hd + j] : 0.0f;
        memset(ot, 0, 2 * (size_t)vd * 8 * sizeof *ot);
        if (na == 2) {
            block_scores(type, kv, gi, qt, 2, hd, nk, n0, scale, tile, st, ld_st);
        } else {
            block_scores(type, kv, gi, qt, 1, hd, nk, n0, scale, tile, st, ld_st);
        }
        for (uint32_t a = 0; a < na; a++) block_softmax(st + a * ld_st, nk, n0, inv + a * 8);
        if (na == 2) block_values(type, kv, gv, 2, vd, nk, st, ld_st, tile, ot);
        else block_values(type, kv, gv, 1, vd, nk, st, ld_st, tile, ot);
        for (uint32_t i = 0; i < nt; i++)
            for (uint32_t a = 0; a < na; a++) {
                float *oa = o + i * ld_o + (size_t)(a0 + a) * vd;
                const float s = inv[a * 8 + i];
                for (uint32_t c = 0; c < vd; c++) oa[c] = ot[((size_t)a * vd + c) * 8 + i] * s;
            }
    }
}

AVX2_FN int attn_block_avx2(const attn_kv *kv, uint32_t n0, uint32_t nt, const float *q,
                            size_t ld_q, uint32_t nq, uint32_t hd, float scale,
                            const float *gate, size_t ld_g, float *o, size_t ld_o,
                            float *scratch) {
    const uint32_t vd = attn_v_dim(kv, hd);
    if (nt == 0 || nt > ATTN_BLOCK_T || n0 + nt > ATTN_BLOCK_MAX_KEYS || hd % 8 || vd % 8 ||
        hd == 0 || vd == 0 || hd > ATTN_BLOCK_MAX_DIM || vd > ATTN_BLOCK_MAX_DIM)
        return 0;
    if (kv->type == NEEDLE_KV_INT8 && (kv->col0 % 8 || attn_v_col0(kv) % 8 || kv->group % 8))
        return 0;
    for (uint32_t i0 = 0; i0 < nt; i0 += 8) {
        const uint32_t n8 = nt - i0 < 8 ? nt - i0 : 8;
        const float *qi = q + i0 * ld_q;
        float *oi = o + i0 * ld_o;
        switch (kv->type) {
        case NEEDLE_KV_F32:
            block_typed(NEEDLE_KV_F32, kv, n0 + i0, n8, qi, ld_q, nq, hd, scale, oi, ld_o, scratch);
            break;
        case NEEDLE_KV_F16:
            block_typed(NEEDLE_KV_F16, kv, n0 + i0, n8, qi, ld_q, nq, hd, scale, oi, ld_o, scratch);
            break;
        default:
            block_typed(NEEDLE_KV_INT8, kv, n0 + i0, n8, qi, ld_q, nq, hd, scale, oi, ld_o, scratch);
        }
    }
    if (gate)
        for (uint32_t i = 0; i < nt; i++) gate_avx2(o + i * ld_o, gate + i * ld_g, nq * vd);
    return 1;
}

#else

/* ISO C forbids an empty translation unit */
typedef int attn_avx2_unavailable;

#endif
