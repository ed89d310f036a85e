/* The NEON attention kernel (see attn.h) on 128-bit vectors, 8 columns as two float32x4
 * at a time. Scores: each K row converted once (f16 by fcvtl, int8 by sign extension
 * times its group's scale, exactly the plain kernel's dequantised value) into one
 * accumulator pair per query head, up to four heads per row read, one row at a time (the
 * AVX2 kernel's four-row blocks and int8 scale folding are not ported: this code is
 * checked under qemu, its speed never measured). Softmax: vector max, the polynomial exp
 * of attn_avx2.c, vector sum. Values: 16 columns of o for two heads in registers across
 * all positions. Then the output gate.
 *
 * An int8 head that does not start on a multiple of 8 columns takes the plain kernel;
 * on other architectures this file compiles to nothing. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/attn.h"
#include "needle.h"
#include "kernels/cpu/neon.h"

/* int8 heads up to 8 * ATTN_MAX_BLOCKS columns take the SIMD path */
#define ATTN_MAX_BLOCKS 64

#if NEEDLE_NEON

#define NEON_INLINE static inline __attribute__((always_inline))

/* exp(x) for x <= 0: the reduction and polynomial of exp_avx2 (attn_avx2.c). */
NEON_INLINE float32x4_t exp_neon(float32x4_t x) {
    x = vmaxq_f32(x, vdupq_n_f32(-87.3f));
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

/* 8 values of a row from column j as floats (two vectors). */
NEON_INLINE float32x4x2_t load8(int32_t type, const void *row, const float *sc,
                                const uint32_t *gi, uint32_t j) {
    float32x4x2_t v;
    if (type == NEEDLE_KV_F32) {
        v.val[0] = vld1q_f32((const float *)row + j);
        v.val[1] = vld1q_f32((const float *)row + j + 4);
    } else if (type == NEEDLE_KV_F16) {
        const uint16x8_t h = vld1q_u16((const uint16_t *)row + j);
        v.val[0] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
        v.val[1] = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h)));
    } else {
        const int16x8_t b = vmovl_s8(vld1_s8((const int8_t *)row + j));
        const float s = sc[gi[j / 8]];
        v.val[0] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(b))), s);
        v.val[1] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(b))), s);
    }
    return v;
}

/* One value, the plain kernel's conversion. */
NEON_INLINE float load1(int32_t type, const void *row, const float *sc, uint32_t col0,
                        uint32_t group, uint32_t j) {
    if (type == NEEDLE_KV_F32) return ((const float *)row)[j];
    if (type == NEEDLE_KV_F16) {
        const uint16x4_t h = vdup_n_u16(((const uint16_t *)row)[j]);
        return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(h)), 0);
    }
    return (float)((const int8_t *)row)[j] * sc[(col0 + j) / group];
}

NEON_INLINE const void *row_at(int32_t type, const void *base, size_t at) {
    if (type == NEEDLE_KV_F32) return (const float *)base + at;
    if (type == NEEDLE_KV_F16) return (const uint16_t *)base + at;
    return (const int8_t *)base + at;
}

NEON_INLINE void scores4(int32_t type, const attn_kv *kv, const attn_run *runs,
                         uint32_t n_runs, const uint32_t *gi, const float *q, uint32_t a0,
                         uint32_t na, uint32_t hd, float scale, float *w, size_t ld_w) {
    const uint32_t hd8 = hd & ~7u;
    uint32_t n = 0;
    for (uint32_t r = 0; r < n_runs; r++)
        for (uint32_t i = 0; i < runs[r].count; i++, n++) {
            const uint32_t slot = runs[r].slot + i;
            const void *row = row_at(type, kv->k, (size_t)slot * kv->ld);
            const float *sc = kv->k_scales ? kv->k_scales + (size_t)slot * kv->scales_ld : NULL;
            float32x4_t acc[4][2];
            for (uint32_t a = 0; a < 4; a++) acc[a][0] = acc[a][1] = vdupq_n_f32(0.0f);
            for (uint32_t j = 0; j < hd8; j += 8) {
                const float32x4x2_t k8 = load8(type, row, sc, gi, j);
                for (uint32_t a = 0; a < na; a++) {
                    const float *qa = q + (size_t)(a0 + a) * hd + j;
                    acc[a][0] = vfmaq_f32(acc[a][0], vld1q_f32(qa), k8.val[0]);
                    acc[a][1] = vfmaq_f32(acc[a][1], vld1q_f32(qa + 4), k8.val[1]);
                }
            }
            for (uint32_t a = 0; a < na; a++) {
                float s = vaddvq_f32(vaddq_f32(acc[a][0], acc[a][1]));
                for (uint32_t j = hd8; j < hd; j++)
                    s += q[(size_t)(a0 + a) * hd + j] *
                         load1(type, row, sc, kv->col0, kv->group, j);
                w[(size_t)(a0 + a) * ld_w + n] = s * scale;
            }
        }
}

/* w := exp(w - max w) over n positions; returns 1 / sum. */
NEON_INLINE float softmax_row(float *w, uint32_t n) {
    const uint32_t n4 = n & ~3u;
    float mx = w[0];
    if (n4) {
        float32x4_t m = vld1q_f32(w);
        for (uint32_t i = 4; i < n4; i += 4) m = vmaxq_f32(m, vld1q_f32(w + i));
        mx = vmaxvq_f32(m);
    }
    for (uint32_t i = n4; i < n; i++) mx = w[i] > mx ? w[i] : mx;
    const float32x4_t mv = vdupq_n_f32(mx);
    float32x4_t sum = vdupq_n_f32(0.0f);
    for (uint32_t i = 0; i < n4; i += 4) {
        const float32x4_t e = exp_neon(vsubq_f32(vld1q_f32(w + i), mv));
        vst1q_f32(w + i, e);
        sum = vaddq_f32(sum, e);
    }
    float s = vaddvq_f32(sum);
    if (n > n4) {
        float t[4] = {0};
        memcpy(t, w + n4, (n - n4) * sizeof *t);
        vst1q_f32(t, exp_neon(vsubq_f32(vld1q_f32(t), mv)));
        for (uint32_t i = n4; i < n; i++) {
            w[i] = t[i - n4];
            s += w[i];
        }
    }
    return 1.0f / s;
}

/* o[a][c0, c0 + 8*nc) for heads a0, a0 + 1 (na <= 2), nc <= 2 blocks of 8 columns. */
NEON_INLINE void values_block(int32_t type, const attn_kv *kv, const attn_run *runs,
                              uint32_t n_runs, const uint32_t *gi, uint32_t a0, uint32_t na, uint32_t c0,
                              uint32_t nc, uint32_t hd, const float *w, size_t ld_w,
                              const float *inv, float *o) {
    float32x4_t acc[2][4];
    for (uint32_t a = 0; a < 2; a++)
        for (uint32_t c = 0; c < 4; c++) acc[a][c] = vdupq_n_f32(0.0f);
    const float *w0 = w + (size_t)a0 * ld_w, *w1 = w0 + ld_w;
    uint32_t n = 0;
    for (uint32_t r = 0; r < n_runs; r++)
        for (uint32_t i = 0; i < runs[r].count; i++, n++) {
            const uint32_t slot = runs[r].slot + i;
            const void *row = row_at(type, kv->v, (size_t)slot * kv->ld);
            const float *sc = kv->v_scales ? kv->v_scales + (size_t)slot * kv->scales_ld : NULL;
            const float c0w = w0[n] * inv[0], c1w = na > 1 ? w1[n] * inv[1] : 0.0f;
            for (uint32_t c = 0; c < nc; c++) {
                const float32x4x2_t v8 = load8(type, row, sc, gi, c0 + 8 * c);
                acc[0][2 * c] = vfmaq_n_f32(acc[0][2 * c], v8.val[0], c0w);
                acc[0][2 * c + 1] = vfmaq_n_f32(acc[0][2 * c + 1], v8.val[1], c0w);
                if (na > 1) {
                    acc[1][2 * c] = vfmaq_n_f32(acc[1][2 * c], v8.val[0], c1w);
                    acc[1][2 * c + 1] = vfmaq_n_f32(acc[1][2 * c + 1], v8.val[1], c1w);
                }
            }
        }
    for (uint32_t a = 0; a < na; a++)
        for (uint32_t c = 0; c < 2 * nc; c++)
            vst1q_f32(o + (size_t)(a0 + a) * hd + c0 + 4 * c, acc[a][c]);
}

NEON_INLINE void attend_typed(int32_t type, const attn_kv *kv, const attn_run *runs,
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
    for (uint32_t a0 = 0; a0 < nq; a0 += 4)
        scores4(type, kv, runs, n_runs, gi, q, a0, nq - a0 < 4 ? nq - a0 : 4, hd, scale, w, ld_w);
    const uint32_t vd8 = vd & ~7u;
    for (uint32_t a0 = 0; a0 < nq; a0 += 2) {
        const uint32_t na = nq - a0 < 2 ? nq - a0 : 2;
        float inv[2] = {0.0f, 0.0f};
        for (uint32_t a = 0; a < na; a++) inv[a] = softmax_row(w + (size_t)(a0 + a) * ld_w, n);
        for (uint32_t c0 = 0; c0 < vd8; c0 += 16) {
            const uint32_t nc = (vd8 - c0) / 8 < 2 ? (vd8 - c0) / 8 : 2;
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

/* o[i] *= sigmoid(g[i]), as gate_avx2 (attn_avx2.c). */
NEON_INLINE void gate_neon(float *o, const float *g, uint32_t n) {
    uint32_t i = 0;
    const float32x4_t one = vdupq_n_f32(1.0f);
    for (; i + 4 <= n; i += 4) {
        const float32x4_t z = vminq_f32(vnegq_f32(vld1q_f32(g + i)), vdupq_n_f32(88.0f));
        const float32x4_t sg = vdivq_f32(one, vaddq_f32(one, exp_neon(z)));
        vst1q_f32(o + i, vmulq_f32(vld1q_f32(o + i), sg));
    }
    for (; i < n; i++) o[i] *= 1.0f / (1.0f + expf(-g[i]));
}

void attn_neon(const attn_kv *kv, const attn_run *runs, uint32_t n_runs,
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
    if (gate) gate_neon(o, gate, nq * attn_v_dim(kv, hd));
}

#else

/* ISO C forbids an empty translation unit */
typedef int attn_neon_unavailable;

#endif
