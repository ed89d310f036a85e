/* What the NEON kernels (*_neon.c) need of the target, on 64-bit and 32-bit ARM.
 *
 * NEEDLE_NEON is 1 where they compile: little-endian aarch64 (AdvSIMD with FMA and
 * half-precision conversion is part of every such CPU) and little-endian 32-bit ARM built
 * with NEON and VFPv4 (fused multiply-add, half-precision conversion; the build gives
 * those files -mfpu=neon-vfpv4). On 32-bit ARM, NEON and VFPv4 are optional parts of an
 * ARMv7 CPU, so cpu_kernels_neon() asks the kernel (AT_HWCAP) before handing out the
 * table; the rest of the library is built for the plain ARMv7 baseline.
 *
 * The kernels are written with AArch64 intrinsics. The few that ARMv7 lacks are defined
 * below over ARMv7 ones with the same result, lane for lane, as the AArch64 instruction:
 * reductions pairwise in the order of faddp ((a0 + a1) + (a2 + a3)), table lookups where
 * an index past the table gives 0, zips and unzips as two halves of the ARMv7 pair.
 * One difference remains that no code can remove: ARMv7 Advanced SIMD arithmetic flushes
 * subnormal inputs and results to zero (its fixed "standard" FPSCR), where AArch64 and the
 * plain kernels keep them. The tests compare the levels to a float tolerance, which the
 * rare subnormal does not reach. */
#ifndef NEEDLE_KERNELS_CPU_NEON_H
#define NEEDLE_KERNELS_CPU_NEON_H

#if defined(__ARM_NEON) && defined(__ORDER_LITTLE_ENDIAN__) && \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ &&                  \
    (defined(__aarch64__) || (defined(__ARM_FEATURE_FMA) && defined(__ARM_FP16_FORMAT_IEEE)))
#define NEEDLE_NEON 1
#else
#define NEEDLE_NEON 0
#endif

#if NEEDLE_NEON
#include <arm_neon.h>

#if !defined(__aarch64__)
#include <math.h>

static inline float vaddvq_f32(float32x4_t x) {
    const float32x2_t p = vpadd_f32(vget_low_f32(x), vget_high_f32(x));
    return vget_lane_f32(p, 0) + vget_lane_f32(p, 1);
}
static inline int32_t vaddvq_s32(int32x4_t x) {
    const int32x2_t p = vpadd_s32(vget_low_s32(x), vget_high_s32(x));
    return vget_lane_s32(p, 0) + vget_lane_s32(p, 1);
}
static inline float vmaxvq_f32(float32x4_t x) {
    const float32x2_t p = vpmax_f32(vget_low_f32(x), vget_high_f32(x));
    return vget_lane_f32(vpmax_f32(p, p), 0);
}
static inline float32x4_t vfmaq_n_f32(float32x4_t a, float32x4_t b, float s) {
    return vfmaq_f32(a, b, vdupq_n_f32(s));
}
/* Round to nearest, ties to even: adding and subtracting 2^23 with the sign of x rounds
 * in the default mode for |x| < 2^23; larger values (and NaN) are integral already. */
static inline float32x4_t vrndnq_f32(float32x4_t x) {
    const float32x4_t big = vdupq_n_f32(8388608.0f);
    const uint32x4_t sign = vandq_u32(vreinterpretq_u32_f32(x), vdupq_n_u32(0x80000000u));
    const float32x4_t c = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(big), sign));
    const float32x4_t r = vsubq_f32(vaddq_f32(x, c), c);
    const uint32x4_t small = vcltq_f32(vabsq_f32(x), big);
    return vbslq_f32(small, r, x);
}
/* IEEE division lane by lane (VFP's scalar divide; NEON has only an estimate). */
static inline float32x4_t vdivq_f32(float32x4_t a, float32x4_t b) {
    float x[4], y[4];
    vst1q_f32(x, a);
    vst1q_f32(y, b);
    for (int i = 0; i < 4; i++) x[i] /= y[i];
    return vld1q_f32(x);
}
static inline uint8x16_t vqtbl1q_u8(uint8x16_t t, uint8x16_t idx) {
    uint8x8x2_t tab;
    tab.val[0] = vget_low_u8(t);
    tab.val[1] = vget_high_u8(t);
    return vcombine_u8(vtbl2_u8(tab, vget_low_u8(idx)), vtbl2_u8(tab, vget_high_u8(idx)));
}
static inline uint8x16_t vzip1q_u8(uint8x16_t a, uint8x16_t b) { return vzipq_u8(a, b).val[0]; }
static inline uint8x16_t vzip2q_u8(uint8x16_t a, uint8x16_t b) { return vzipq_u8(a, b).val[1]; }
static inline uint16x8_t vzip1q_u16(uint16x8_t a, uint16x8_t b) { return vzipq_u16(a, b).val[0]; }
static inline uint16x8_t vzip2q_u16(uint16x8_t a, uint16x8_t b) { return vzipq_u16(a, b).val[1]; }
static inline uint8x16_t vuzp1q_u8(uint8x16_t a, uint8x16_t b) { return vuzpq_u8(a, b).val[0]; }
#endif /* !__aarch64__ */

/* 1 when this CPU runs the NEON kernels: always on aarch64; on 32-bit ARM when the kernel
 * reports NEON and VFPv4 (cq_neon.c). */
int neon_available(void);
#endif /* NEEDLE_NEON */

#endif
