/* The AVX-512F Needle 3 kernels (see monarch.h): combine_rows builds a block of up to 8
 * output rows by up to 64 columns (4 zmm vectors per row) in registers, so each input
 * row x[r] is loaded once per block and feeds every output row of it. One output row at
 * a time (AVX2's combine) is bound by its loads and by the latency of its few
 * accumulator chains; a Monarch block product (32 rows of 32 columns) is then a 32x32x32
 * matrix product that this blocking runs at the FMA ports' rate.
 *
 * Arithmetic: every output lane is one FMA chain over r = 0..n-1 from zero, as in AVX2's
 * combine (vector lanes and its scalar tail alike), so results are bit-identical to the
 * AVX2 level whatever the blocking; columns past the last whole 16 use masked loads and
 * stores of the same chains. combine and mul_add are the AVX2 ones. On other
 * architectures this file provides only monarch_kernels_avx512() returning NULL. */
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/monarch.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx2,fma")))
#define AVX512_FN __attribute__((target("avx512f,avx2,fma")))

/* Output rows [0, R) of the block at out/c, columns [l0, l0 + 16 * NV) with the last
 * vector's lanes limited by `last`. */
AVX512_INLINE void rows_block(float *out, size_t out_ld, const float *c, size_t c_row,
                              size_t c_ld, const float *x, uint32_t n, uint32_t w, uint32_t l0,
                              __mmask16 last, const uint32_t NV, const uint32_t R) {
    __m512 acc[8][4];
    for (uint32_t i = 0; i < R; i++)
        for (uint32_t v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
    for (uint32_t r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * w + l0, *cr = c + (size_t)r * c_ld;
        __m512 xv[4];
        for (uint32_t v = 0; v + 1 < NV; v++) xv[v] = _mm512_loadu_ps(xr + 16 * v);
        xv[NV - 1] = _mm512_maskz_loadu_ps(last, xr + 16 * (NV - 1));
        for (uint32_t i = 0; i < R; i++) {
            const __m512 cb = _mm512_set1_ps(cr[(size_t)i * c_row]);
            for (uint32_t v = 0; v < NV; v++) acc[i][v] = _mm512_fmadd_ps(cb, xv[v], acc[i][v]);
        }
    }
    for (uint32_t i = 0; i < R; i++) {
        float *o = out + (size_t)i * out_ld + l0;
        for (uint32_t v = 0; v + 1 < NV; v++) _mm512_storeu_ps(o + 16 * v, acc[i][v]);
        _mm512_mask_storeu_ps(o + 16 * (NV - 1), last, acc[i][NV - 1]);
    }
}

/* Rows [i, m) of one column block of NV vectors: blocks of R rows (at most 8 rows of up
 * to 2 vectors, 6 of 3, 4 of 4: 16-24 accumulators), then 4, then one at a time. */
#define ROWS_AT(i, NV, R)                                                                    \
    rows_block(out + (size_t)(i) * out_ld, out_ld, c + (size_t)(i) * c_row, c_row, c_ld, x, n, \
               w, l0, last, NV, R)
#define ROW_LOOP(NV, R)                                                                      \
    do {                                                                                     \
        for (; i + (R) <= m; i += (R)) ROWS_AT(i, NV, R);                                    \
        for (; i + 4 <= m; i += 4) ROWS_AT(i, NV, 4);                                        \
        for (; i < m; i++) ROWS_AT(i, NV, 1);                                                \
    } while (0)

static AVX512_FN void combine_rows_avx512(float *out, size_t out_ld, const float *c,
                                          size_t c_row, size_t c_ld, const float *x, uint32_t n,
                                          uint32_t w, uint32_t m) {
    for (uint32_t l0 = 0; l0 < w; l0 += 64) {
        const uint32_t cols = w - l0 < 64 ? w - l0 : 64, tail = cols % 16;
        const __mmask16 last = (__mmask16)(tail ? (1u << tail) - 1 : 0xFFFFu);
        uint32_t i = 0;
        switch ((cols + 15) / 16) {
        case 1: ROW_LOOP(1, 8); break;
        case 2: ROW_LOOP(2, 8); break;
        case 3: ROW_LOOP(3, 6); break;
        default: ROW_LOOP(4, 4); break;
        }
    }
}

#undef ROW_LOOP
#undef ROWS_AT

static const monarch_kernels table = {"avx512", monarch_avx2_combine, monarch_avx2_mul_add,
                                      combine_rows_avx512};

const monarch_kernels *monarch_kernels_avx512(void) {
    return cpu_kernels_avx512() && monarch_kernels_avx2() ? &table : NULL;
}

#else

const monarch_kernels *monarch_kernels_avx512(void) { return NULL; }

#endif
