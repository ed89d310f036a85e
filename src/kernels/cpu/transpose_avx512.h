/* A 16 x 16 transpose of 32-bit elements in AVX-512F registers, shared by the one-token
 * 2-bit products (cq_decode_avx512.c: 16 rows' code words side by side) and the AMX
 * level's token tiles (cq_gemm_amx.c). x86 builds with GCC or clang only; include it
 * after <immintrin.h>. */
#ifndef NEEDLE_KERNELS_CPU_TRANSPOSE_AVX512_H
#define NEEDLE_KERNELS_CPU_TRANSPOSE_AVX512_H

/* out[i] holds element i of r[0..15] (r and out may not overlap): pairs of rows
 * interleaved, then pairs of pairs, then the four 128-bit lanes gathered across
 * registers; 64 shuffles. */
static inline __attribute__((always_inline, target("avx512f"))) void
transpose16x16_epi32(const __m512i r[16], __m512i out[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4i + j], 128-bit lane L: element 4L + j of rows 4i .. 4i + 3 */
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        const __m512i a = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);
        const __m512i b = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD);
        const __m512i c = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
        const __m512i d = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
        out[j] = _mm512_shuffle_i32x4(a, c, 0x88);
        out[8 + j] = _mm512_shuffle_i32x4(a, c, 0xDD);
        out[4 + j] = _mm512_shuffle_i32x4(b, d, 0x88);
        out[12 + j] = _mm512_shuffle_i32x4(b, d, 0xDD);
    }
}

#endif
