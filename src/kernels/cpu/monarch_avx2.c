/* The AVX2 + FMA Needle 3 kernels (see monarch.h): an output row is built in registers,
 * up to 64 columns (8 vectors) at a time, over all the rows it combines, so each output
 * is written once and each input row read once per column block. Columns past the last
 * whole 8 are summed in scalar, in the same order. On other architectures this file
 * provides only monarch_kernels_avx2() returning NULL. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/monarch.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma")))
#define AVX2_FN __attribute__((target("avx2,fma")))

/* out[l0, l0 + 8*NV) of combine(), NV vectors held in registers */
AVX2_INLINE void combine_block(float *out, const float *c, size_t c_ld, const float *x,
                               uint32_t n, uint32_t w, uint32_t l0, const uint32_t NV) {
    __m256 acc[8];
    for (uint32_t v = 0; v < NV; v++) acc[v] = _mm256_setzero_ps();
    for (uint32_t r = 0; r < n; r++) {
        const __m256 cr = _mm256_set1_ps(c[(size_t)r * c_ld]);
        const float *xr = x + (size_t)r * w + l0;
        for (uint32_t v = 0; v < NV; v++)
            acc[v] = _mm256_fmadd_ps(cr, _mm256_loadu_ps(xr + 8 * v), acc[v]);
    }
    for (uint32_t v = 0; v < NV; v++) _mm256_storeu_ps(out + l0 + 8 * v, acc[v]);
}

AVX2_FN void monarch_avx2_combine(float *out, const float *c, size_t c_ld, const float *x,
                                 uint32_t n, uint32_t w) {
    const uint32_t w8 = w & ~7u;
    uint32_t l0 = 0;
    for (; l0 + 64 <= w8; l0 += 64) combine_block(out, c, c_ld, x, n, w, l0, 8);
    if (l0 + 32 <= w8) {
        combine_block(out, c, c_ld, x, n, w, l0, 4);
        l0 += 32;
    }
    for (; l0 < w8; l0 += 8) combine_block(out, c, c_ld, x, n, w, l0, 1);
    for (uint32_t l = w8; l < w; l++) {
        float acc = 0.0f;
        for (uint32_t r = 0; r < n; r++) acc = fmaf(c[(size_t)r * c_ld], x[(size_t)r * w + l], acc);
        out[l] = acc;
    }
}

AVX2_FN void monarch_avx2_mul_add(float *out, const float *a, const float *b, uint32_t n) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i),
                                                  _mm256_loadu_ps(out + i)));
    for (; i < n; i++) out[i] = fmaf(a[i], b[i], out[i]);
}

static AVX2_FN void combine_rows_avx2(float *out, size_t out_ld, const float *c, size_t c_row,
                                      size_t c_ld, const float *x, uint32_t n, uint32_t w,
                                      uint32_t m) {
    for (uint32_t i = 0; i < m; i++)
        monarch_avx2_combine(out + (size_t)i * out_ld, c + (size_t)i * c_row, c_ld, x, n, w);
}

static const monarch_kernels table = {"avx2", monarch_avx2_combine, monarch_avx2_mul_add,
                                      combine_rows_avx2};

const monarch_kernels *monarch_kernels_avx2(void) { return cpu_kernels_avx2() ? &table : NULL; }

#else

const monarch_kernels *monarch_kernels_avx2(void) { return NULL; }

#endif
