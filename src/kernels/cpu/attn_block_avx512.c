/* The AVX-512F prefill attention block (attn.h attn_block_avx512): the AVX2 block kernel's
 * formulation (attn_avx2.c) with the block's 16 tokens in the lanes of one zmm vector.
 *
 * Scores: Qt holds query column j of the 16 tokens side by side; 8 keys x 2 query heads
 * are 16 accumulators, each step one Qt load per head and one broadcast key element per
 * key feeding 16 FMAs, so a key row (converted to floats once per tile of keys) serves
 * every token and both heads. Softmax per lane: vertical max, exp, sum; a key after a
 * token (causal) gets weight 0 in that lane. Values: Ot[c] = sum_k P[k] * v_k[c], 8
 * columns x 2 heads of accumulators, the 16 tokens' weights of key k times v_k[c]
 * broadcast; Ot is written back per token at the end, times the lane's 1/sum. Then the
 * output gate, o *= sigmoid(gate).
 *
 * The exp is exp_avx2's (attn_avx2.c) on 16 lanes, the same operations. The results
 * depend only on the token's inputs, the cache and the block's first position. On other
 * architectures this file compiles to nothing. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/attn.h"
#include "needle.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#define Z_INLINE static inline __attribute__((always_inline, target("avx512f,avx2,fma,f16c")))
#define Z_FN __attribute__((target("avx512f,avx2,fma,f16c")))
/* the accumulator arrays must stay in registers: fully unrolled loops over them */
#define Z_UNROLL8 _Pragma("GCC unroll 8")

#define LANES 16
#define KEYS 8 /* keys per score step */
#define COLS 8 /* value columns per step */
#define MAX_GROUPS 64

/* exp(x) for x <= 0, as exp_avx2 (attn_avx2.c) */
Z_INLINE __m512 exp_z(__m512 x) {
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
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n),
                                                         _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* rows [r0, r0 + nr) of a K or V head as floats, out[u * cols + j] (cols % 8 == 0); int8:
 * sc_g[j / 8] is the scale group of columns [j, j + 8) */
Z_INLINE void tile_z(int32_t type, const void *base, size_t ld, const float *scales,
                     size_t scales_ld, const uint32_t *sc_g, uint32_t r0, uint32_t nr,
                     uint32_t cols, float *out) {
    for (uint32_t u = 0; u < nr; u++) {
        const size_t at = (size_t)(r0 + u) * ld;
        float *dst = out + (size_t)u * cols;
        if (type == NEEDLE_KV_F16) {
            const uint16_t *row = (const uint16_t *)base + at;
            for (uint32_t j = 0; j < cols; j += 8)
                _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + j))));
        } else {
            const int8_t *row = (const int8_t *)base + at;
            const float *sc = scales + (size_t)(r0 + u) * scales_ld;
            for (uint32_t j = 0; j < cols; j += 8) {
                const __m128i b = _mm_loadl_epi64((const __m128i *)(row + j));
                _mm256_storeu_ps(dst + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
                                                        _mm256_set1_ps(sc[sc_g[j / 8]])));
            }
        }
    }
}

/* lanes (tokens) i with n0 + i < k: key k comes after them */
Z_INLINE __mmask16 future_z(uint32_t k, uint32_t n0) {
    const __m512 lane = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_cmp_ps_mask(lane, _mm512_set1_ps((float)(k - n0)), _CMP_LT_OQ);
}

Z_INLINE void store_score_z(float *st, uint32_t k, uint32_t n0, __m512 acc, __m512 sv) {
    __m512 s = _mm512_mul_ps(acc, sv);
    if (k > n0) s = _mm512_mask_blend_ps(future_z(k, n0), s, _mm512_set1_ps(-INFINITY));
    _mm512_storeu_ps(st + (size_t)k * LANES, s);
}

/* st[a][k] = scale * <q_a, k_k> for the 16 tokens, heads a < NA, keys [0, nk) */
Z_INLINE void scores_z(int32_t type, const attn_kv *kv, const uint32_t *gk, const float *qt,
                       const int NA, uint32_t hd, uint32_t nk, uint32_t n0, float scale,
                       float *tile, float *st, size_t ld_st) {
    const __m512 sv = _mm512_set1_ps(scale);
    for (uint32_t k0 = 0; k0 < nk; k0 += ATTN_BLOCK_KEY_TILE) {
        const uint32_t nr = nk - k0 < ATTN_BLOCK_KEY_TILE ? nk - k0 : ATTN_BLOCK_KEY_TILE;
        const float *kr = tile;
        size_t kld = hd;
        if (type == NEEDLE_KV_F32) {
            kr = (const float *)kv->k + (size_t)k0 * kv->ld;
            kld = kv->ld;
        } else {
            tile_z(type, kv->k, kv->ld, kv->k_scales, kv->scales_ld, gk, k0, nr, hd, tile);
        }
        uint32_t u = 0;
        for (; u + KEYS <= nr; u += KEYS) {
            __m512 acc0[KEYS], acc1[KEYS];
            Z_UNROLL8
            for (int x = 0; x < KEYS; x++) acc0[x] = acc1[x] = _mm512_setzero_ps();
            const float *r = kr + (size_t)u * kld;
            for (uint32_t j = 0; j < hd; j++) {
                const __m512 qa = _mm512_loadu_ps(qt + (size_t)j * LANES);
                const __m512 qb = NA > 1 ? _mm512_loadu_ps(qt + ((size_t)hd + j) * LANES) : qa;
                Z_UNROLL8
                for (int x = 0; x < KEYS; x++) {
                    const __m512 kb = _mm512_set1_ps(r[(size_t)x * kld + j]);
                    acc0[x] = _mm512_fmadd_ps(qa, kb, acc0[x]);
                    if (NA > 1) acc1[x] = _mm512_fmadd_ps(qb, kb, acc1[x]);
                }
            }
            Z_UNROLL8
            for (uint32_t x = 0; x < KEYS; x++) {
                store_score_z(st, k0 + u + x, n0, acc0[x], sv);
                if (NA > 1) store_score_z(st + ld_st, k0 + u + x, n0, acc1[x], sv);
            }
        }
        for (; u < nr; u++) {
            __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
            const float *r = kr + (size_t)u * kld;
            for (uint32_t j = 0; j < hd; j++) {
                const __m512 kb = _mm512_set1_ps(r[j]);
                acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(qt + (size_t)j * LANES), kb, acc0);
                if (NA > 1)
                    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(qt + ((size_t)hd + j) * LANES), kb,
                                           acc1);
            }
            store_score_z(st, k0 + u, n0, acc0, sv);
            if (NA > 1) store_score_z(st + ld_st, k0 + u, n0, acc1, sv);
        }
    }
}

/* st := exp(st - max) per lane over keys [0, nk), keys after the lane's token 0;
 * inv := 1 / sum per lane */
Z_INLINE void softmax_z(float *st, uint32_t nk, uint32_t n0, float *inv) {
    __m512 m = _mm512_loadu_ps(st);
    for (uint32_t k = 1; k < nk; k++) m = _mm512_max_ps(m, _mm512_loadu_ps(st + (size_t)k * LANES));
    __m512 sum = _mm512_setzero_ps();
    for (uint32_t k = 0; k < nk; k++) {
        __m512 e = exp_z(_mm512_sub_ps(_mm512_loadu_ps(st + (size_t)k * LANES), m));
        if (k > n0) e = _mm512_maskz_mov_ps(_mm512_knot(future_z(k, n0)), e);
        _mm512_storeu_ps(st + (size_t)k * LANES, e);
        sum = _mm512_add_ps(sum, e);
    }
    _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), sum));
}

/* ot[a][c] += sum_k st[a][k] * v_k[c] for heads a < NA, keys [0, nk), columns [0, vd) */
Z_INLINE void values_z(int32_t type, const attn_kv *kv, const uint32_t *gv, const int NA,
                       uint32_t vd, uint32_t nk, const float *st, size_t ld_st, float *tile,
                       float *ot) {
    for (uint32_t k0 = 0; k0 < nk; k0 += ATTN_BLOCK_KEY_TILE) {
        const uint32_t nr = nk - k0 < ATTN_BLOCK_KEY_TILE ? nk - k0 : ATTN_BLOCK_KEY_TILE;
        const float *vr = tile;
        size_t vld = vd;
        if (type == NEEDLE_KV_F32) {
            vr = (const float *)kv->v + (size_t)k0 * kv->ld;
            vld = kv->ld;
        } else {
            tile_z(type, kv->v, kv->ld, kv->v_scales, kv->scales_ld, gv, k0, nr, vd, tile);
        }
        const float *p0 = st + (size_t)k0 * LANES, *p1 = p0 + ld_st;
        for (uint32_t c = 0; c < vd; c += COLS) {
            __m512 acc0[COLS], acc1[COLS];
            Z_UNROLL8
            for (uint32_t x = 0; x < COLS; x++) {
                acc0[x] = _mm512_loadu_ps(ot + (size_t)(c + x) * LANES);
                acc1[x] = NA > 1 ? _mm512_loadu_ps(ot + ((size_t)vd + c + x) * LANES) : acc0[x];
            }
            for (uint32_t u = 0; u < nr; u++) {
                const __m512 pa = _mm512_loadu_ps(p0 + (size_t)u * LANES);
                const __m512 pb = NA > 1 ? _mm512_loadu_ps(p1 + (size_t)u * LANES) : pa;
                const float *r = vr + (size_t)u * vld + c;
                Z_UNROLL8
                for (uint32_t x = 0; x < COLS; x++) {
                    const __m512 vb = _mm512_set1_ps(r[x]);
                    acc0[x] = _mm512_fmadd_ps(pa, vb, acc0[x]);
                    if (NA > 1) acc1[x] = _mm512_fmadd_ps(pb, vb, acc1[x]);
                }
            }
            Z_UNROLL8
            for (uint32_t x = 0; x < COLS; x++) {
                _mm512_storeu_ps(ot + (size_t)(c + x) * LANES, acc0[x]);
                if (NA > 1) _mm512_storeu_ps(ot + ((size_t)vd + c + x) * LANES, acc1[x]);
            }
        }
    }
}

Z_INLINE void block_z(int32_t type, const attn_kv *kv, uint32_t n0, uint32_t nt,
                      const float *q, size_t ld_q, uint32_t nq, uint32_t hd, float scale,
                      float *o, size_t ld_o, float *scratch) {
    const uint32_t vd = attn_v_dim(kv, hd), nk = n0 + nt;
    const size_t ld_st = (size_t)ATTN_BLOCK_MAX_KEYS * LANES;
    float *st = scratch, *tile = st + 2 * ld_st;
    float *qt = tile + (size_t)ATTN_BLOCK_KEY_TILE * (hd > vd ? hd : vd);
    float *ot = qt + 2 * (size_t)hd * LANES, *inv = ot + 2 * (size_t)vd * LANES;
    uint32_t gk[MAX_GROUPS], gv[MAX_GROUPS];
    if (type == NEEDLE_KV_INT8) {
        for (uint32_t j = 0; j < hd; j += 8) gk[j / 8] = (kv->col0 + j) / kv->group;
        for (uint32_t j = 0; j < vd; j += 8) gv[j / 8] = (attn_v_col0(kv) + j) / kv->group;
    }
    for (uint32_t a0 = 0; a0 < nq; a0 += 2) {
        const uint32_t na = nq - a0 < 2 ? nq - a0 : 2;
        /* the lanes of tokens past nt hold zero queries: finite scores, outputs unused */
        for (uint32_t a = 0; a < na; a++)
            for (uint32_t j = 0; j < hd; j++)
                for (uint32_t i = 0; i < LANES; i++)
                    qt[((size_t)a * hd + j) * LANES + i] =
                        i < nt ? q[i * ld_q + (size_t)(a0 + a) * hd + j] : 0.0f;
        memset(ot, 0, 2 * (size_t)vd * LANES * sizeof *ot);
        if (na == 2) scores_z(type, kv, gk, qt, 2, hd, nk, n0, scale, tile, st, ld_st);
        else scores_z(type, kv, gk, qt, 1, hd, nk, n0, scale, tile, st, ld_st);
        for (uint32_t a = 0; a < na; a++) softmax_z(st + a * ld_st, nk, n0, inv + a * LANES);
        if (na == 2) values_z(type, kv, gv, 2, vd, nk, st, ld_st, tile, ot);
        else values_z(type, kv, gv, 1, vd, nk, st, ld_st, tile, ot);
        for (uint32_t i = 0; i < nt; i++)
            for (uint32_t a = 0; a < na; a++) {
                float *oa = o + i * ld_o + (size_t)(a0 + a) * vd;
                const float s = inv[a * LANES + i];
                for (uint32_t c = 0; c < vd; c++) oa[c] = ot[((size_t)a * vd + c) * LANES + i] * s;
            }
    }
}

/* o[i] *= sigmoid(g[i]), exp's argument clamped as in gate_avx2 */
Z_INLINE void gate_z(float *o, const float *g, uint32_t n) {
    uint32_t i = 0;
    const __m512 one = _mm512_set1_ps(1.0f), hi = _mm512_set1_ps(88.0f);
    for (; i + LANES <= n; i += LANES) {
        const __m512 z = _mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_loadu_ps(g + i)), hi);
        const __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, exp_z(z)));
        _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_loadu_ps(o + i), sg));
    }
    for (; i < n; i++) o[i] *= 1.0f / (1.0f + expf(-g[i]));
}

Z_FN int attn_block_avx512(const attn_kv *kv, uint32_t n0, uint32_t nt, const float *q,
                           size_t ld_q, uint32_t nq, uint32_t hd, float scale,
                           const float *gate, size_t ld_g, float *o, size_t ld_o,
                           float *scratch) {
    const uint32_t vd = attn_v_dim(kv, hd);
    if (nt == 0 || nt > LANES || n0 + nt > ATTN_BLOCK_MAX_KEYS || hd % 8 || vd % 8 ||
        hd == 0 || vd == 0 || hd > ATTN_BLOCK_MAX_DIM || vd > ATTN_BLOCK_MAX_DIM)
        return 0;
    if (kv->type == NEEDLE_KV_INT8 && (kv->col0 % 8 || attn_v_col0(kv) % 8 || kv->group % 8))
        return 0;
    switch (kv->type) {
    case NEEDLE_KV_F32:
        block_z(NEEDLE_KV_F32, kv, n0, nt, q, ld_q, nq, hd, scale, o, ld_o, scratch);
        break;
    case NEEDLE_KV_F16:
        block_z(NEEDLE_KV_F16, kv, n0, nt, q, ld_q, nq, hd, scale, o, ld_o, scratch);
        break;
    default:
        block_z(NEEDLE_KV_INT8, kv, n0, nt, q, ld_q, nq, hd, scale, o, ld_o, scratch);
    }
    if (gate)
        for (uint32_t i = 0; i < nt; i++) gate_z(o + i * ld_o, gate + i * ld_g, nq * vd);
    return 1;
}

#else

/* ISO C forbids an empty translation unit */
typedef int attn_block_avx512_unavailable;

#endif
