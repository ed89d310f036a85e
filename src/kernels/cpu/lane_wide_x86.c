/* The lane_wide kernels (lane_wide.h) for x86-64: lane_wide_impl.h instantiated for AVX2
 * (two tokens to a vector) and AVX-512F (four). Functions carry target attributes, as in
 * the other x86 kernels, and run only after the kernel level's CPU probe. The build is
 * ISO C (-ffp-contract=off), so no multiply-add is fused: the bits are the portable ones. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/lane_wide.h"
#include "kernels/nmath.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* ---- AVX2: 8 floats ---------------------------------------------------------------- */

#define WV __m256
#define WI __m256i
#define WIDTH 8
#define WFN __attribute__((target("avx2")))
#define WNAME(x) avx2_lane_##x
#define WV_SET(x) _mm256_set1_ps(x)
#define WV_ADD(a, b) _mm256_add_ps(a, b)
#define WV_SUB(a, b) _mm256_sub_ps(a, b)
#define WV_MUL(a, b) _mm256_mul_ps(a, b)
#define WV_MIN(a, b) _mm256_min_ps(a, b) /* minps/maxps: the NaN rule of nm_exp_poly */
#define WV_MAX(a, b) _mm256_max_ps(a, b)
#define WV_SELECT_LT(a, b, x, y) _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OS))
#define WV_ZERO_IF_LT(a, b, v) _mm256_andnot_ps(_mm256_cmp_ps(a, b, _CMP_LT_OS), v)
#define WV_BITS(v) _mm256_castps_si256(v)
#define WV_FLOAT(v) _mm256_castsi256_ps(v)
#define WI_SET(x) _mm256_set1_epi32((int)(x))
#define WI_ADD(a, b) _mm256_add_epi32(a, b)
#define WI_SUB(a, b) _mm256_sub_epi32(a, b)
#define WI_AND(a, b) _mm256_and_si256(a, b)
#define WI_OR(a, b) _mm256_or_si256(a, b)
#define WI_SHL(a, k) _mm256_slli_epi32(a, k)
#define WI_SHR(a, k) _mm256_srli_epi32(a, k)
#define WI_TO_FLOAT(a) _mm256_cvtepi32_ps(a)
#define WV_LOAD(p) _mm256_loadu_ps(p)
#define WV_STORE(p, v) _mm256_storeu_ps(p, v)
#define WV_UNPACKLO(a, b) _mm256_unpacklo_ps(a, b)
#define WV_UNPACKHI(a, b) _mm256_unpackhi_ps(a, b)
#define WV_SHUFFLE(a, b, imm) _mm256_shuffle_ps(a, b, imm)
#define WV_DIV(a, b) _mm256_div_ps(a, b)
#define WV_NEG(a) _mm256_xor_ps(a, _mm256_set1_ps(-0.0f))
#include "kernels/cpu/lane_wide_impl.h"
#undef WV
#undef WI
#undef WIDTH
#undef WFN
#undef WNAME
#undef WV_SET
#undef WV_ADD
#undef WV_SUB
#undef WV_MUL
#undef WV_MIN
#undef WV_MAX
#undef WV_SELECT_LT
#undef WV_ZERO_IF_LT
#undef WV_BITS
#undef WV_FLOAT
#undef WI_SET
#undef WI_ADD
#undef WI_SUB
#undef WI_AND
#undef WI_OR
#undef WI_SHL
#undef WI_SHR
#undef WI_TO_FLOAT
#undef WV_LOAD
#undef WV_STORE
#undef WV_UNPACKLO
#undef WV_UNPACKHI
#undef WV_SHUFFLE
#undef WV_DIV
#undef WV_NEG

/* ---- AVX-512F: 16 floats ----------------------------------------------------------- */

#define WV __m512
#define WI __m512i
#define WIDTH 16
#define WFN __attribute__((target("avx512f")))
#define WNAME(x) avx512_lane_##x
#define WV_SET(x) _mm512_set1_ps(x)
#define WV_ADD(a, b) _mm512_add_ps(a, b)
#define WV_SUB(a, b) _mm512_sub_ps(a, b)
#define WV_MUL(a, b) _mm512_mul_ps(a, b)
#define WV_MIN(a, b) _mm512_min_ps(a, b)
#define WV_MAX(a, b) _mm512_max_ps(a, b)
#define WV_SELECT_LT(a, b, x, y) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OS), y, x)
#define WV_ZERO_IF_LT(a, b, v) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, b, _CMP_NLT_US), v)
#define WV_BITS(v) _mm512_castps_si512(v)
#define WV_FLOAT(v) _mm512_castsi512_ps(v)
#define WI_SET(x) _mm512_set1_epi32((int)(x))
#define WI_ADD(a, b) _mm512_add_epi32(a, b)
#define WI_SUB(a, b) _mm512_sub_epi32(a, b)
#define WI_AND(a, b) _mm512_and_si512(a, b)
#define WI_OR(a, b) _mm512_or_si512(a, b)
#define WI_SHL(a, k) _mm512_slli_epi32(a, k)
#define WI_SHR(a, k) _mm512_srli_epi32(a, k)
#define WI_TO_FLOAT(a) _mm512_cvtepi32_ps(a)
#define WV_LOAD(p) _mm512_loadu_ps(p)
#define WV_STORE(p, v) _mm512_storeu_ps(p, v)
#define WV_UNPACKLO(a, b) _mm512_unpacklo_ps(a, b)
#define WV_UNPACKHI(a, b) _mm512_unpackhi_ps(a, b)
#define WV_SHUFFLE(a, b, imm) _mm512_shuffle_ps(a, b, imm)
#define WV_DIV(a, b) _mm512_div_ps(a, b)
#define WV_NEG(a) /* the sign bit flipped: AVX-512F has no float xor */ \
    _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN)))
#include "kernels/cpu/lane_wide_impl.h"

/* nm_rms_unit of up to LANE_NORM_BATCH rows: nm_mean_square's eight partial sums (element i
 * into sum i % 8) are one 8-float vector, a row's sums a chain of adds four cycles apart;
 * rows side by side fill those cycles. The same code serves the AVX-512 level: the order of
 * the sums fixes the width at eight. */
__attribute__((target("avx2"))) static void avx2_rms_unit_rows(const float *x, size_t ld_x,
                                                               uint32_t n, uint32_t count,
                                                               float *out, size_t ld_out) {
    __m256 acc[LANE_NORM_BATCH];
    for (uint32_t t = 0; t < LANE_NORM_BATCH; t++) acc[t] = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (uint32_t t = 0; t < count; t++) {
            const __m256 v = _mm256_loadu_ps(x + t * ld_x + i);
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(v, v));
        }
    for (uint32_t t = 0; t < count; t++) {
        const float *row = x + t * ld_x;
        float a[8];
        _mm256_storeu_ps(a, acc[t]);
        for (uint32_t j = 0; i + j < n; j++) {
            const float sq = row[i + j] * row[i + j];
            a[j] += sq;
        }
        const float lo = (a[0] + a[1]) + (a[2] + a[3]);
        const float hi = (a[4] + a[5]) + (a[6] + a[7]);
        const float inv = 1.0f / sqrtf((lo + hi) / (float)n + NM_NORM_EPS);
        const __m256 vinv = _mm256_set1_ps(inv);
        float *o = out + t * ld_out;
        uint32_t k = 0;
        for (; k + 8 <= n; k += 8) _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_loadu_ps(row + k), vinv));
        for (; k < n; k++) o[k] = row[k] * inv;
    }
}

static const lane_wide_kernels avx2_table = {
    .name = "avx2", .sinkhorn_batch = 8,
    .sinkhorn4 = avx2_lane_sinkhorn4, .rewrite4 = avx2_lane_rewrite4,
    .read4 = avx2_lane_read4, .rms_unit_rows = avx2_rms_unit_rows,
    .hada_gate = avx2_lane_hada_gate,
};
static const lane_wide_kernels avx512_table = {
    .name = "avx512", .sinkhorn_batch = 16,
    .sinkhorn4 = avx512_lane_sinkhorn4, .rewrite4 = avx512_lane_rewrite4,
    .read4 = avx512_lane_read4, .rms_unit_rows = avx2_rms_unit_rows,
    .hada_gate = avx512_lane_hada_gate,
};

const lane_wide_kernels *lane_wide_kernels_named(const char *name) {
    if (!name) return NULL;
    /* the levels' own probes: each returns NULL where the CPU or OS lacks its state */
    if (!strcmp(name, "avx512")) return cpu_kernels_avx512() ? &avx512_table : NULL;
    if (!strcmp(name, "avx2")) return cpu_kernels_avx2() ? &avx2_table : NULL;
    return NULL;
}

#else

const lane_wide_kernels *lane_wide_kernels_named(const char *name) {
    (void)name;
    return NULL;
}

#endif
