/* Vector exp/log for the per-token ops of the CPU backend: the Sinkhorn of the lane mix
 * (§3.4) on 4 lanes, the 4 x 4 matrix held in four vectors, and the SiLU gate of the
 * Hadamard MLP (§3.7).
 *
 * Same operations as nm_sinkhorn with nm_exp_poly / nm_log_poly (kernels/nmath.h), lane by
 * lane, so the results are bit-identical to it (tests/kernels/test_lanes.c): a row step is the
 * column step on the transposed matrix, and a column step reduces the four row vectors
 * element-wise in the order the scalar loop sums its rows. Only baseline instructions
 * (SSE2 on x86-64, NEON on aarch64): no run-time dispatch, and no fma anywhere (the scalar
 * version has none). Other lane counts and other targets run nm_sinkhorn. */
#ifndef NEEDLE_KERNELS_CPU_LANE_MATH_H
#define NEEDLE_KERNELS_CPU_LANE_MATH_H

#include <stdint.h>
#include "kernels/nmath.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#define LANE_MATH_SIMD 1
typedef __m128 lv4;
typedef __m128i lv4i;
#define LV_SET(x) _mm_set1_ps(x)
#define LV_ADD(a, b) _mm_add_ps(a, b)
#define LV_SUB(a, b) _mm_sub_ps(a, b)
#define LV_MUL(a, b) _mm_mul_ps(a, b)
/* a < b ? a : b and a > b ? a : b, element-wise, as the scalar code writes them */
#define LV_MIN(a, b) _mm_min_ps(a, b)
#define LV_MAX(a, b) _mm_max_ps(a, b)
#define LV_SELECT_LT(a, b, x, y) lv_select(_mm_cmplt_ps(a, b), x, y)
#define LV_CMPLT(a, b) _mm_cmplt_ps(a, b)
#define LV_ANDNOT(mask, v) _mm_andnot_ps(mask, v) /* v where mask is clear, else 0 */
#define LV_BITS(v) _mm_castps_si128(v)
#define LV_FLOAT(v) _mm_castsi128_ps(v)
#define LVI_SET(x) _mm_set1_epi32((int)(x))
#define LVI_ADD(a, b) _mm_add_epi32(a, b)
#define LVI_SUB(a, b) _mm_sub_epi32(a, b)
#define LVI_AND(a, b) _mm_and_si128(a, b)
#define LVI_OR(a, b) _mm_or_si128(a, b)
#define LVI_SHL(a, k) _mm_slli_epi32(a, k)
#define LVI_SHR(a, k) _mm_srli_epi32(a, k)
#define LVI_TO_FLOAT(a) _mm_cvtepi32_ps(a)
#define LV_LOAD(p) _mm_loadu_ps(p)
#define LV_STORE(p, v) _mm_storeu_ps(p, v)
#define LV_DIV(a, b) _mm_div_ps(a, b)
#define LV_NEG(a) _mm_xor_ps(a, _mm_set1_ps(-0.0f))

static inline lv4 lv_select(__m128 mask, lv4 x, lv4 y) {
    return _mm_or_ps(_mm_and_ps(mask, x), _mm_andnot_ps(mask, y));
}

static inline void lv_transpose(lv4 v[4]) { _MM_TRANSPOSE4_PS(v[0], v[1], v[2], v[3]); }

#elif defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#define LANE_MATH_SIMD 1
typedef float32x4_t lv4;
typedef uint32x4_t lv4i;
#define LV_SET(x) vdupq_n_f32(x)
#define LV_ADD(a, b) vaddq_f32(a, b)
#define LV_SUB(a, b) vsubq_f32(a, b)
#define LV_MUL(a, b) vmulq_f32(a, b)
/* NEON's fmin/fmax treat NaN differently from the scalar ternaries: select instead */
#define LV_MIN(a, b) vbslq_f32(vcltq_f32(a, b), a, b)
#define LV_MAX(a, b) vbslq_f32(vcgtq_f32(a, b), a, b)
#define LV_SELECT_LT(a, b, x, y) vbslq_f32(vcltq_f32(a, b), x, y)
#define LV_CMPLT(a, b) vreinterpretq_f32_u32(vcltq_f32(a, b))
#define LV_ANDNOT(mask, v) \
    vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(v), vreinterpretq_u32_f32(mask)))
#define LV_BITS(v) vreinterpretq_u32_f32(v)
#define LV_FLOAT(v) vreinterpretq_f32_u32(v)
#define LVI_SET(x) vdupq_n_u32((uint32_t)(x))
#define LVI_ADD(a, b) vaddq_u32(a, b)
#define LVI_SUB(a, b) vsubq_u32(a, b)
#define LVI_AND(a, b) vandq_u32(a, b)
#define LVI_OR(a, b) vorrq_u32(a, b)
#define LVI_SHL(a, k) vshlq_n_u32(a, k)
#define LVI_SHR(a, k) vshrq_n_u32(a, k)
#define LVI_TO_FLOAT(a) vcvtq_f32_s32(vreinterpretq_s32_u32(a))
#define LV_LOAD(p) vld1q_f32(p)
#define LV_STORE(p, v) vst1q_f32(p, v)
#define LV_DIV(a, b) vdivq_f32(a, b)
#define LV_NEG(a) vnegq_f32(a)

static inline void lv_transpose(lv4 v[4]) {
    const float32x4_t a = vtrn1q_f32(v[0], v[1]), b = vtrn2q_f32(v[0], v[1]);
    const float32x4_t c = vtrn1q_f32(v[2], v[3]), d = vtrn2q_f32(v[2], v[3]);
    v[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(c)));
    v[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(b), vreinterpretq_f64_f32(d)));
    v[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(c)));
    v[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(b), vreinterpretq_f64_f32(d)));
}
#endif

#ifdef LANE_MATH_SIMD
/* nm_exp_poly, four at a time */
static inline lv4 lv_exp(lv4 x) {
    const lv4 below = LV_CMPLT(x, LV_SET(NM_EXP_LO));
    x = LV_MIN(x, LV_SET(NM_EXP_HI));
    x = LV_MAX(x, LV_SET(NM_EXP_LO));
    const lv4 t = LV_ADD(LV_MUL(x, LV_SET(NM_LOG2E)), LV_SET(NM_ROUND_MAGIC));
    const lv4 n = LV_SUB(t, LV_SET(NM_ROUND_MAGIC));
    lv4 r = LV_SUB(x, LV_MUL(n, LV_SET(NM_LN2_HI)));
    r = LV_SUB(r, LV_MUL(n, LV_SET(NM_LN2_LO)));
    const lv4 r2 = LV_MUL(r, r);
    const lv4 r4 = LV_MUL(r2, r2);
    const lv4 a = LV_ADD(LV_MUL(LV_SET(1.9875691500e-4f), r), LV_SET(1.3981999507e-3f));
    const lv4 b = LV_ADD(LV_MUL(LV_SET(8.3334519073e-3f), r), LV_SET(4.1665795894e-2f));
    const lv4 c = LV_ADD(LV_MUL(LV_SET(1.6666665459e-1f), r), LV_SET(5.0000001201e-1f));
    lv4 p = LV_ADD(LV_MUL(a, r4), LV_ADD(LV_MUL(b, r2), c));
    p = LV_ADD(LV_ADD(LV_MUL(p, r2), r), LV_SET(1.0f));
    const lv4i k = LVI_SUB(LV_BITS(t), LV_BITS(LV_SET(NM_ROUND_MAGIC)));
    const lv4 scale = LV_ANDNOT(below, LV_FLOAT(LVI_SHL(LVI_ADD(k, LVI_SET(127)), 23)));
    return LV_MUL(p, scale);
}

/* nm_log_poly, four at a time */
static inline lv4 lv_log(lv4 x) {
    const lv4i bits = LV_BITS(x);
    lv4 e = LVI_TO_FLOAT(LVI_SUB(LVI_SHR(bits, 23), LVI_SET(126)));
    lv4 m = LV_FLOAT(LVI_OR(LVI_AND(bits, LVI_SET(0x007fffffu)), LVI_SET(0x3f000000u)));
    const lv4 half = LV_SET(NM_SQRT_HALF);
    e = LV_SELECT_LT(m, half, LV_SUB(e, LV_SET(1.0f)), e);
    m = LV_SELECT_LT(m, half, LV_ADD(m, m), m);
    const lv4 f = LV_SUB(m, LV_SET(1.0f));
    const lv4 z = LV_MUL(f, f);
    const lv4 z2 = LV_MUL(z, z);
    const lv4 p01 = LV_ADD(LV_MUL(LV_SET(7.0376836292e-2f), f), LV_SET(-1.1514610310e-1f));
    const lv4 p23 = LV_ADD(LV_MUL(LV_SET(1.1676998740e-1f), f), LV_SET(-1.2420140846e-1f));
    const lv4 p45 = LV_ADD(LV_MUL(LV_SET(1.4249322787e-1f), f), LV_SET(-1.6668057665e-1f));
    const lv4 p67 = LV_ADD(LV_MUL(LV_SET(2.0000714765e-1f), f), LV_SET(-2.4999993993e-1f));
    lv4 y = LV_ADD(LV_MUL(LV_ADD(LV_MUL(p01, z), p23), z2), LV_ADD(LV_MUL(p45, z), p67));
    y = LV_ADD(LV_MUL(y, f), LV_SET(3.3333331174e-1f));
    y = LV_MUL(y, LV_MUL(f, z));
    y = LV_ADD(y, LV_MUL(e, LV_SET(NM_LN2_LO)));
    y = LV_SUB(y, LV_MUL(z, LV_SET(0.5f)));
    return LV_ADD(LV_ADD(f, y), LV_MUL(e, LV_SET(NM_LN2_HI)));
}

/* Normalises the four vectors as the scalar loop normalises one line of the matrix per
 * vector element: max, then sum of exp in vector order, then subtract m + log(sum). */
static inline void lv_normalise(lv4 v[4]) {
    const lv4 m = LV_MAX(LV_MAX(LV_MAX(v[0], v[1]), v[2]), v[3]);
    lv4 sum = lv_exp(LV_SUB(v[0], m));
    sum = LV_ADD(sum, lv_exp(LV_SUB(v[1], m)));
    sum = LV_ADD(sum, lv_exp(LV_SUB(v[2], m)));
    sum = LV_ADD(sum, lv_exp(LV_SUB(v[3], m)));
    const lv4 lse = LV_ADD(m, lv_log(sum));
    for (int k = 0; k < 4; k++) v[k] = LV_SUB(v[k], lse);
}
#endif

/* nm_sinkhorn(P, n), in vectors when n == 4 */
static inline void lane_sinkhorn(float *P, uint32_t n) {
#ifdef LANE_MATH_SIMD
    if (n == 4) {
        lv4 v[4];
        for (int r = 0; r < 4; r++) v[r] = LV_LOAD(P + 4 * r);
        for (int it = 0; it < NM_SINKHORN_ROUNDS; it++) {
            lv_transpose(v); /* rows: the columns' vectors reduce across a row */
            lv_normalise(v);
            lv_transpose(v);
            lv_normalise(v);
        }
        for (int r = 0; r < 4; r++) LV_STORE(P + 4 * r, lv_exp(v[r]));
        return;
    }
#endif
    nm_sinkhorn(P, n);
}

/* nm_sinkhorn(P + 16 j, 4) for the `count` (<= LANE_SINKHORN_BATCH) 4 x 4 matrices at P.
 * One Sinkhorn is a chain of dependent steps that leaves the core mostly waiting; steps
 * of independent matrices interleaved fill that time (several tokens at once). */
#define LANE_SINKHORN_BATCH 4
static inline void lane_sinkhorn4_batch(float *P, uint32_t count) {
#ifdef LANE_MATH_SIMD
    lv4 v[LANE_SINKHORN_BATCH][4];
    for (uint32_t j = 0; j < count; j++)
        for (int r = 0; r < 4; r++) v[j][r] = LV_LOAD(P + 16 * j + 4 * r);
    for (int it = 0; it < NM_SINKHORN_ROUNDS; it++) {
        for (uint32_t j = 0; j < count; j++) {
            lv_transpose(v[j]);
            lv_normalise(v[j]);
        }
        for (uint32_t j = 0; j < count; j++) {
            lv_transpose(v[j]);
            lv_normalise(v[j]);
        }
    }
    for (uint32_t j = 0; j < count; j++)
        for (int r = 0; r < 4; r++) LV_STORE(P + 16 * j + 4 * r, lv_exp(v[j][r]));
#else
    for (uint32_t j = 0; j < count; j++) nm_sinkhorn(P + 16 * j, 4);
#endif
}

/* The gate of the Hadamard MLP in place: v = d2[i] * (z[i] * scale), z[i] = v * sigmoid(v),
 * with sigmoid(v) = 1 / (1 + nm_exp_poly(-v)); the vector and scalar parts give the same
 * bits, so where the tail starts does not matter. */
static inline void lane_hada_gate(float *z, const float *d2, float scale, uint32_t n) {
    uint32_t i = 0;
#ifdef LANE_MATH_SIMD
    const lv4 one = LV_SET(1.0f), sc = LV_SET(scale);
    for (; i + 4 <= n; i += 4) {
        const lv4 v = LV_MUL(LV_LOAD(d2 + i), LV_MUL(LV_LOAD(z + i), sc));
        const lv4 sig = LV_DIV(one, LV_ADD(one, lv_exp(LV_NEG(v))));
        LV_STORE(z + i, LV_MUL(v, sig));
    }
#endif
    for (; i < n; i++) {
        const float v = d2[i] * (z[i] * scale);
        const float sig = 1.0f / (1.0f + nm_exp_poly(-v));
        z[i] = v * sig;
    }
}

#endif
