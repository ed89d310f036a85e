/* The scalar math of spec §3 written once, for every backend: plain C (the CPU ops, the
 * CPU kernels, the Metal kernels compiled as C on Linux), CUDA (host and device) and the
 * Metal Shading Language (this file opens the Metal library's single source, see
 * CMakeLists.txt).
 *
 * Only the common subset of the three languages: scalar code, only <metal_stdlib> under
 * Metal,
 * math through the NM_* wrappers, pointers to buffers as NM_DEVICE (MSL's `device`
 * address space; nothing elsewhere). Functions are NM_FN (static inline, plus
 * __host__ __device__ under nvcc). Every function is written in the order of operations
 * of the original CPU code, so the CPU path is bit-identical to what it was. Block-
 * parallel versions (CUDA reductions) use the constants and the per-element functions
 * but sum in their own order. */
#ifndef NEEDLE_KERNELS_NMATH_H
#define NEEDLE_KERNELS_NMATH_H

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
#define NM_FN static inline
#define NM_DEVICE device
typedef uint nm_u32;
#define NM_EXP(x) metal::exp(x)
#define NM_LOG(x) metal::log(x)
#define NM_SQRT(x) metal::sqrt(x)
#define NM_FMAX(a, b) metal::fmax((a), (b))
#else
#include <math.h>
#include <stdint.h>
#ifdef __CUDACC__
#define NM_FN static inline __host__ __device__
#else
#define NM_FN static inline
#endif
#define NM_DEVICE
typedef uint32_t nm_u32;
#define NM_EXP(x) expf(x)
#define NM_LOG(x) logf(x)
#define NM_SQRT(x) sqrtf(x)
#define NM_FMAX(a, b) fmaxf((a), (b))
#endif

/* ---- exp and log of the Sinkhorn (plain C) ------------------------------------------------
 *
 * libm's expf/logf are calls the compiler cannot vectorize, and the Sinkhorn of the lane mix
 * makes ~1000 of them per token and layer. These are written so that a SIMD version doing
 * the same operations lane by lane (kernels/cpu/lane_math.h) gives the same bits: one
 * IEEE operation per statement, no a*b+c in one expression (so no compiler fuses it into an
 * fma: GCC does not contract in ISO C mode, clang only within an expression), bit
 * manipulation for the powers of two. Cody-Waite reduction and minimax polynomials in the
 * style of Cephes; the bounds are checked in tests/kernels/test_lanes.c. CUDA and Metal keep their
 * native exp/log (NM_LSE_EXP/NM_LSE_LOG below). */
#if !defined(__METAL_VERSION__) && !defined(__CUDACC__)
typedef union nm_bits {
    float f;
    uint32_t u;
} nm_bits;

#define NM_EXP_LO (-87.3365447505531f)   /* exp(lo) = 2^-126, the smallest normal */
#define NM_EXP_HI 88.3762626647949f      /* the largest x whose 2^n fits the exponent field */
#define NM_LOG2E 1.44269504088896341f
#define NM_LN2_HI 0.693359375f           /* 9 bits: n * NM_LN2_HI is exact for |n| <= 128 */
#define NM_LN2_LO (-2.12194440e-4f)      /* ln 2 - NM_LN2_HI */
#define NM_ROUND_MAGIC 12582912.0f       /* 1.5 * 2^23: (t + M) - M rounds t to an integer */
#define NM_SQRT_HALF 0.707106781186547524f

/* exp(x) within 1.01 ulp (every 13th float measured) for x in [NM_EXP_LO, NM_EXP_HI]; 0
 * below, exp(NM_EXP_HI) above. The clamps are written as x86's maxps/minps compute them
 * (the second operand when either is NaN), so that a NaN gives the same bits in every
 * version. */
NM_FN float nm_exp_poly(float x) {
    const int below = x < NM_EXP_LO;
    x = x < NM_EXP_HI ? x : NM_EXP_HI;
    x = x > NM_EXP_LO ? x : NM_EXP_LO;
    float t = x * NM_LOG2E;
    t = t + NM_ROUND_MAGIC;
    nm_bits tb, mb;
    tb.f = t;
    mb.f = NM_ROUND_MAGIC;
    const float n = t - NM_ROUND_MAGIC;
    float hi = n * NM_LN2_HI;
    float r = x - hi;
    const float lo = n * NM_LN2_LO;
    r = r - lo;
    /* e^r = 1 + r + r^2 q(r), q of degree 5 in Estrin's form: the Sinkhorn is a chain of
     * dependent exp/log, so the depth of the polynomial is its cost */
    const float r2 = r * r;
    const float r4 = r2 * r2;
    float a = 1.9875691500e-4f * r;
    a = a + 1.3981999507e-3f;
    float b = 8.3334519073e-3f * r;
    b = b + 4.1665795894e-2f;
    float c = 1.6666665459e-1f * r;
    c = c + 5.0000001201e-1f;
    b = b * r2;
    b = b + c;
    a = a * r4;
    float p = a + b;
    p = p * r2;
    p = p + r;
    p = p + 1.0f;
    /* n = round(x log2 e) sits in the low mantissa bits of t; 2^n from the exponent field,
     * 0 below the range */
    nm_bits scale;
    scale.u = below ? 0u : (tb.u - mb.u + 127u) << 23;
    return p * scale.f;
}

/* log(x) within 0.82 ulp (every 13th float measured) for positive normal x (the Sinkhorn's
 * sums are >= 1). */
NM_FN float nm_log_poly(float x) {
    nm_bits b;
    b.f = x;
    float e = (float)((int32_t)(b.u >> 23) - 126); /* x = m * 2^e, m in [0.5, 1) */
    b.u = (b.u & 0x007fffffu) | 0x3f000000u;
    float m = b.f;
    /* m in [sqrt(1/2), sqrt(2)) keeps f = m - 1 small */
    const int small = m < NM_SQRT_HALF;
    e = small ? e - 1.0f : e;
    m = small ? m + m : m;
    const float f = m - 1.0f;
    /* log(1 + f) = f - z/2 + f z y(f), z = f^2, y of degree 8 in Estrin's form */
    const float z = f * f;
    const float z2 = z * z;
    float p01 = 7.0376836292e-2f * f;
    p01 = p01 + -1.1514610310e-1f;
    float p23 = 1.1676998740e-1f * f;
    p23 = p23 + -1.2420140846e-1f;
    float p45 = 1.4249322787e-1f * f;
    p45 = p45 + -1.6668057665e-1f;
    float p67 = 2.0000714765e-1f * f;
    p67 = p67 + -2.4999993993e-1f;
    p01 = p01 * z;
    p01 = p01 + p23;
    p45 = p45 * z;
    p45 = p45 + p67;
    p01 = p01 * z2;
    float y = p01 + p45;
    y = y * f;
    y = y + 3.3333331174e-1f;
    const float fz = f * z;
    y = y * fz;
    const float elo = e * NM_LN2_LO;
    y = y + elo;
    const float hz = z * 0.5f;
    y = y - hz;
    float r = f + y;
    const float ehi = e * NM_LN2_HI;
    r = r + ehi;
    return r;
}
#define NM_LSE_EXP(x) nm_exp_poly(x)
#define NM_LSE_LOG(x) nm_log_poly(x)
#else
#define NM_LSE_EXP(x) NM_EXP(x)
#define NM_LSE_LOG(x) NM_LOG(x)
#endif

/* ---- the constants of the spec ---------------------------------------------------------- */

#define NM_NORM_EPS 1e-6f           /* inside every rms: sqrt(mean(x^2) + eps) (§3.4-3.8) */
#define NM_SINKHORN_ROUNDS 20       /* row + column normalisations of the lane mix (§3.4) */
#define NM_LANE_PRE_OWN 4.0f        /* lane read bias: a layer's own lane ... (§3.4) */
#define NM_LANE_PRE_OTHER (-4.0f)   /* ... and every other lane */
#define NM_LANE_POST_OWN 0.0f       /* lane write bias: own lane ... */
#define NM_LANE_POST_OTHER (-4.0f)  /* ... and the others */
#define NM_LANE_POST_GAIN 2.0f      /* hpost = 2 * sigmoid(...) */
#define NM_ENGRAM_SEED 0x9E3779B9u  /* engram hash: seed * (table + 1) ... (§3.3) */
#define NM_ENGRAM_PRIME 0x01000193u /* ... then (acc ^ token) * prime per n-gram token */
#define NM_ENGRAM_SHIFT 15u         /* final acc ^= acc >> 15, then % slots */

/* ---- KV cache layout -------------------------------------------------------------------- */

/* The cache slot of absolute position p: `n_sinks` pinned slots for positions [0, n_sinks),
 * then a ring of `window` slots (0 = no window: the ring is the whole context). */
NM_FN nm_u32 nm_kv_slot(nm_u32 p, nm_u32 n_sinks, nm_u32 window) {
    if (p < n_sinks) return p;
    if (window) return n_sinks + (p - n_sinks) % window;
    return p;
}

/* The positions the token at t attends to: the sinks [0, n_sink), then the window tail
 * [tail0, t] (empty while the sinks reach past t). */
typedef struct nm_span {
    nm_u32 n_sink, tail0;
} nm_span;

NM_FN nm_span nm_attention_span(nm_u32 t, nm_u32 n_sinks, nm_u32 window) {
    nm_u32 first = n_sinks;
    if (window && t + 1u > window && t + 1u - window > first) first = t + 1u - window;
    nm_span s;
    s.n_sink = n_sinks < t + 1u ? n_sinks : t + 1u;
    s.tail0 = first > s.n_sink ? first : s.n_sink;
    return s;
}

/* ---- elementwise -------------------------------------------------------------------------- */

NM_FN float nm_sigmoid(float z) { return 1.0f / (1.0f + NM_EXP(-z)); }

/* The bias of lane r in the lane read (pre) and write (post) of a layer whose own lane is
 * `own` (layer % n_lanes). */
NM_FN float nm_lane_pre_offset(nm_u32 r, nm_u32 own) {
    return r == own ? NM_LANE_PRE_OWN : NM_LANE_PRE_OTHER;
}

NM_FN float nm_lane_post_offset(nm_u32 r, nm_u32 own) {
    return r == own ? NM_LANE_POST_OWN : NM_LANE_POST_OTHER;
}

/* RoPE of the pair (a, b) = (z[j], z[j + head_dim/2]) by the angle with cosine c, sine s. */
typedef struct nm_pair {
    float a, b;
} nm_pair;

NM_FN nm_pair nm_rope_pair(float a, float b, float c, float s) {
    nm_pair r;
    r.a = a * c - b * s;
    r.b = b * c + a * s;
    return r;
}

/* ---- engram hash (§3.3) ------------------------------------------------------------------- */

/* acc = nm_engram_hash_start(j); acc = nm_engram_hash_step(acc, token) for the n-gram's
 * tokens, newest first; slot = nm_engram_hash_slot(acc, slots). */
NM_FN nm_u32 nm_engram_hash_start(nm_u32 table) { return NM_ENGRAM_SEED * (table + 1u); }

NM_FN nm_u32 nm_engram_hash_step(nm_u32 acc, nm_u32 token) {
    return (acc ^ token) * NM_ENGRAM_PRIME;
}

NM_FN nm_u32 nm_engram_hash_slot(nm_u32 acc, nm_u32 slots) {
    acc ^= acc >> NM_ENGRAM_SHIFT;
    return acc % slots;
}

/* ---- vectors -------------------------------------------------------------------------------- */

/* Eight partial sums (element i into sum i % 8), added pairwise at the end: one fixed order
 * for every backend and thread count, and eight independent chains instead of one long
 * one (a single running sum made the CPU norms wait on the adder's latency). */
NM_FN float nm_mean_square(NM_DEVICE const float *x, nm_u32 n) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    nm_u32 i = 0;
#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__METAL_VERSION__)
    /* the same sums in two 4-wide vectors (GCC keeps the plain loop scalar) */
    typedef float nm_v4 __attribute__((vector_size(16)));
    nm_v4 a0 = {0.0f, 0.0f, 0.0f, 0.0f}, a1 = a0;
    for (; i + 8u <= n; i += 8u) {
        nm_v4 x0, x1;
        __builtin_memcpy(&x0, x + i, sizeof x0);
        __builtin_memcpy(&x1, x + i + 4u, sizeof x1);
        const nm_v4 s0 = x0 * x0, s1 = x1 * x1;
        a0 += s0;
        a1 += s1;
    }
    for (int j = 0; j < 4; j++) {
        acc[j] = a0[j];
        acc[j + 4] = a1[j];
    }
#else
    for (; i + 8u <= n; i += 8u)
        for (nm_u32 j = 0; j < 8u; j++) {
            const float sq = x[i + j] * x[i + j];
            acc[j] += sq;
        }
#endif
    for (nm_u32 j = 0; i + j < n; j++) {
        const float sq = x[i + j] * x[i + j];
        acc[j] += sq;
    }
    const float lo = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    const float hi = (acc[4] + acc[5]) + (acc[6] + acc[7]);
    return (lo + hi) / (float)n;
}

/* 1 / sqrt(mean(x^2) + eps) */
NM_FN float nm_rms_inv(NM_DEVICE const float *x, nm_u32 n) {
    return 1.0f / NM_SQRT(nm_mean_square(x, n) + NM_NORM_EPS);
}

/* rms_unit(x) = x / sqrt(mean(x^2) + eps); out may alias x. */
NM_FN void nm_rms_unit(NM_DEVICE const float *x, nm_u32 n, NM_DEVICE float *out) {
    const float inv = nm_rms_inv(x, n);
    for (nm_u32 i = 0; i < n; i++) out[i] = x[i] * inv;
}

/* ZC(x; s) = (1 + s) * x / sqrt(mean(x^2) + eps); out may alias x. */
NM_FN void nm_zc_norm(NM_DEVICE const float *x, NM_DEVICE const float *s, nm_u32 n,
                      NM_DEVICE float *out) {
    const float rms = NM_SQRT(nm_mean_square(x, n) + NM_NORM_EPS);
    for (nm_u32 i = 0; i < n; i++) out[i] = (1.0f + s[i]) * x[i] / rms;
}

/* RoPE of one head in place: pairs (z[j], z[j + half]) by cs = [cos(half) | sin(half)]. */
NM_FN void nm_rope(NM_DEVICE float *z, nm_u32 head_dim, NM_DEVICE const float *cs) {
    const nm_u32 half = head_dim / 2u;
    for (nm_u32 j = 0; j < half; j++) {
        const nm_pair r = nm_rope_pair(z[j], z[j + half], cs[j], cs[half + j]);
        z[j] = r.a;
        z[j + half] = r.b;
    }
}

/* Stable softmax numerators in place: x[k] = exp(x[k] - max x); returns their sum (the
 * caller divides, as the weights are used). */
NM_FN float nm_softmax_exp(NM_DEVICE float *x, nm_u32 n) {
    float mx = x[0];
    for (nm_u32 k = 1; k < n; k++) mx = NM_FMAX(mx, x[k]);
    float sum = 0.0f;
    for (nm_u32 k = 0; k < n; k++) {
        x[k] = NM_EXP(x[k] - mx);
        sum += x[k];
    }
    return sum;
}

/* Log-space Sinkhorn on the n x n logits P (row-major), NM_SINKHORN_ROUNDS rounds of row
 * then column normalisation, then P = exp(P): a doubly stochastic matrix (§3.4). On the CPU
 * with the exp/log above; kernels/cpu/lane_math.h does the same steps in vectors. */
NM_FN void nm_sinkhorn(NM_DEVICE float *P, nm_u32 n) {
    for (int it = 0; it < NM_SINKHORN_ROUNDS; it++) {
        for (nm_u32 r = 0; r < n; r++) {
            float m = P[r * n];
            for (nm_u32 c = 1; c < n; c++) m = NM_FMAX(m, P[r * n + c]);
            float sum = 0.0f;
            for (nm_u32 c = 0; c < n; c++) sum += NM_LSE_EXP(P[r * n + c] - m);
            const float lse = m + NM_LSE_LOG(sum);
            for (nm_u32 c = 0; c < n; c++) P[r * n + c] -= lse;
        }
        for (nm_u32 c = 0; c < n; c++) {
            float m = P[c];
            for (nm_u32 r = 1; r < n; r++) m = NM_FMAX(m, P[r * n + c]);
            float sum = 0.0f;
            for (nm_u32 r = 0; r < n; r++) sum += NM_LSE_EXP(P[r * n + c] - m);
            const float lse = m + NM_LSE_LOG(sum);
            for (nm_u32 r = 0; r < n; r++) P[r * n + c] -= lse;
        }
    }
    for (nm_u32 k = 0; k < n * n; k++) P[k] = NM_LSE_EXP(P[k]);
}

/* In-place unnormalised fast Walsh-Hadamard transform in Sylvester order, n a power of 2.
 * The SIMD versions (kernels/cpu) do the same butterflies in the same order. */
NM_FN void nm_fwht(NM_DEVICE float *x, nm_u32 n) {
    for (nm_u32 h = 1; h < n; h <<= 1)
        for (nm_u32 i = 0; i < n; i += h << 1)
            for (nm_u32 j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

#endif
