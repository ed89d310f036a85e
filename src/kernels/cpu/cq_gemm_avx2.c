/* Many-token CQ products, AVX2 + FMA (see kernels/cpu/cq_gemm.h).
 *
 * Rows are decoded once into the scratch in panels of up to 12 (each 4 tokens, read from
 * L2 once, serve the whole panel from L1) and met by the tokens in 3-row x 4-token
 * tiles: per 8 columns 3 weight and 4 activation loads feed 12 FMAs in 12 of the 16
 * registers. The pool hands out many-token rows in chunks of 12 (pool.c); a chunk with
 * one row over a multiple of 3 ends with a 4-row panel of two 2-row x 6-token tiles (8
 * loads per 12 FMAs, the second tile reading the tokens from L1), since a lone row runs
 * at half speed (4 accumulators cannot hide the FMA latency). Kernel benchmark, one
 * thread, 2048 x 512 2-bit rows x 256 tokens: 3x4 tiles ~74 GFLOP/s, 2x6 ~67, the old
 * 4-row chunks as 3 + 1 rows ~63 (FMA peak ~91). Leftover tokens go through 2x4 and
 * 1x1 tiles; every tile keeps the one-accumulator-per-pair arithmetic, so the results
 * are those of the tiles before (bit-identical logits). */
#include "kernels/cpu/cq_gemm.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

AVX2_INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Rows w0, w1 against tokens [t, t + 6): y[t + i][yi], y[t + i][yi + 1]. */
AVX2 static void tile2_tok6(const float *w0, const float *w1, const float *xp, uint32_t cols_pad,
                            uint32_t t, float *y, size_t ld_y, uint32_t yi) {
    const float *x0 = xp + (size_t)t * cols_pad;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0;
    for (uint32_t c = 0; c < cols_pad; c += 8) {
        const __m256 u = _mm256_load_ps(w0 + c), v = _mm256_load_ps(w1 + c);
        const float *x = x0 + c;
        __m256 s = _mm256_load_ps(x);
        a0 = _mm256_fmadd_ps(u, s, a0);
        b0 = _mm256_fmadd_ps(v, s, b0);
        s = _mm256_load_ps(x + cols_pad);
        a1 = _mm256_fmadd_ps(u, s, a1);
        b1 = _mm256_fmadd_ps(v, s, b1);
        s = _mm256_load_ps(x + 2 * (size_t)cols_pad);
        a2 = _mm256_fmadd_ps(u, s, a2);
        b2 = _mm256_fmadd_ps(v, s, b2);
        s = _mm256_load_ps(x + 3 * (size_t)cols_pad);
        a3 = _mm256_fmadd_ps(u, s, a3);
        b3 = _mm256_fmadd_ps(v, s, b3);
        s = _mm256_load_ps(x + 4 * (size_t)cols_pad);
        a4 = _mm256_fmadd_ps(u, s, a4);
        b4 = _mm256_fmadd_ps(v, s, b4);
        s = _mm256_load_ps(x + 5 * (size_t)cols_pad);
        a5 = _mm256_fmadd_ps(u, s, a5);
        b5 = _mm256_fmadd_ps(v, s, b5);
    }
    float *o = y + (size_t)t * ld_y + yi;
    o[0] = hsum(a0), o[1] = hsum(b0), o += ld_y;
    o[0] = hsum(a1), o[1] = hsum(b1), o += ld_y;
    o[0] = hsum(a2), o[1] = hsum(b2), o += ld_y;
    o[0] = hsum(a3), o[1] = hsum(b3), o += ld_y;
    o[0] = hsum(a4), o[1] = hsum(b4), o += ld_y;
    o[0] = hsum(a5), o[1] = hsum(b5);
}

/* Rows w0 (and w1 if non-NULL) against tokens [t, t + 4): y[t + i][yi (+ 1)]. */
AVX2 static void tile_tok4(const float *w0, const float *w1, const float *xp, uint32_t cols_pad,
                           uint32_t t, float *y, size_t ld_y, uint32_t yi) {
    const float *x0 = xp + (size_t)t * cols_pad, *x1 = x0 + cols_pad, *x2 = x1 + cols_pad,
                *x3 = x2 + cols_pad;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    if (w1) {
        __m256 b0 = _mm256_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;
        for (uint32_t c = 0; c < cols_pad; c += 8) {
            const __m256 u = _mm256_load_ps(w0 + c), v = _mm256_load_ps(w1 + c);
            __m256 x = _mm256_load_ps(x0 + c);
            a0 = _mm256_fmadd_ps(u, x, a0);
            b0 = _mm256_fmadd_ps(v, x, b0);
            x = _mm256_load_ps(x1 + c);
            a1 = _mm256_fmadd_ps(u, x, a1);
            b1 = _mm256_fmadd_ps(v, x, b1);
            x = _mm256_load_ps(x2 + c);
            a2 = _mm256_fmadd_ps(u, x, a2);
            b2 = _mm256_fmadd_ps(v, x, b2);
            x = _mm256_load_ps(x3 + c);
            a3 = _mm256_fmadd_ps(u, x, a3);
            b3 = _mm256_fmadd_ps(v, x, b3);
        }
        y[(t + 0) * ld_y + yi + 1] = hsum(b0);
        y[(t + 1) * ld_y + yi + 1] = hsum(b1);
        y[(t + 2) * ld_y + yi + 1] = hsum(b2);
        y[(t + 3) * ld_y + yi + 1] = hsum(b3);
    } else {
        for (uint32_t c = 0; c < cols_pad; c += 8) {
            const __m256 u = _mm256_load_ps(w0 + c);
            a0 = _mm256_fmadd_ps(u, _mm256_load_ps(x0 + c), a0);
            a1 = _mm256_fmadd_ps(u, _mm256_load_ps(x1 + c), a1);
            a2 = _mm256_fmadd_ps(u, _mm256_load_ps(x2 + c), a2);
            a3 = _mm256_fmadd_ps(u, _mm256_load_ps(x3 + c), a3);
        }
    }
    y[(t + 0) * ld_y + yi] = hsum(a0);
    y[(t + 1) * ld_y + yi] = hsum(a1);
    y[(t + 2) * ld_y + yi] = hsum(a2);
    y[(t + 3) * ld_y + yi] = hsum(a3);
}

/* Rows w0, w1, w2 against tokens [t, t + 4): y[t + i][yi .. yi + 2]. */
AVX2 static void tile3_tok4(const float *w0, const float *w1, const float *w2, const float *xp,
                            uint32_t cols_pad, uint32_t t, float *y, size_t ld_y, uint32_t yi) {
    const float *x0 = xp + (size_t)t * cols_pad, *x1 = x0 + cols_pad, *x2 = x1 + cols_pad,
                *x3 = x2 + cols_pad;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0, c0 = a0, c1 = a0, c2 = a0, c3 = a0;
    for (uint32_t c = 0; c < cols_pad; c += 8) {
        const __m256 u = _mm256_load_ps(w0 + c), v = _mm256_load_ps(w1 + c);
        const __m256 z = _mm256_load_ps(w2 + c);
        __m256 x = _mm256_load_ps(x0 + c);
        a0 = _mm256_fmadd_ps(u, x, a0);
        b0 = _mm256_fmadd_ps(v, x, b0);
        c0 = _mm256_fmadd_ps(z, x, c0);
        x = _mm256_load_ps(x1 + c);
        a1 = _mm256_fmadd_ps(u, x, a1);
        b1 = _mm256_fmadd_ps(v, x, b1);
        c1 = _mm256_fmadd_ps(z, x, c1);
        x = _mm256_load_ps(x2 + c);
        a2 = _mm256_fmadd_ps(u, x, a2);
        b2 = _mm256_fmadd_ps(v, x, b2);
        c2 = _mm256_fmadd_ps(z, x, c2);
        x = _mm256_load_ps(x3 + c);
        a3 = _mm256_fmadd_ps(u, x, a3);
        b3 = _mm256_fmadd_ps(v, x, b3);
        c3 = _mm256_fmadd_ps(z, x, c3);
    }
    float *o = y + (size_t)t * ld_y + yi;
    o[0] = hsum(a0), o[1] = hsum(b0), o[2] = hsum(c0);
    o += ld_y;
    o[0] = hsum(a1), o[1] = hsum(b1), o[2] = hsum(c1);
    o += ld_y;
    o[0] = hsum(a2), o[1] = hsum(b2), o[2] = hsum(c2);
    o += ld_y;
    o[0] = hsum(a3), o[1] = hsum(b3), o[2] = hsum(c3);
}

/* Row w0 against token t: y[t][yi]. */
AVX2 static void tile_tok1(const float *w0, const float *xp, uint32_t cols_pad, uint32_t t,
                           float *y, size_t ld_y, uint32_t yi) {
    const float *x = xp + (size_t)t * cols_pad;
    __m256 a = _mm256_setzero_ps();
    for (uint32_t c = 0; c < cols_pad; c += 8)
        a = _mm256_fmadd_ps(_mm256_load_ps(w0 + c), _mm256_load_ps(x + c), a);
    y[t * ld_y + yi] = hsum(a);
}

#define PANEL_TRIPLES 4 /* 12 rows: the pool's many-token chunk */

/* Rows [r, r + 4) (decoded at wbuf) against every token: two 2-row x 6-token tiles per 6
 * tokens, the second reading them from L1. */
AVX2 static void panel4(const float *wbuf, uint32_t K, const float *xp, uint32_t ntok, float *y,
                        size_t ld_y, uint32_t yi) {
    const float *w0 = wbuf, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    uint32_t t = 0;
    for (; t + 6 <= ntok; t += 6) {
        tile2_tok6(w0, w1, xp, K, t, y, ld_y, yi);
        tile2_tok6(w2, w3, xp, K, t, y, ld_y, yi + 2);
    }
    for (; t + 4 <= ntok; t += 4) {
        tile_tok4(w0, w1, xp, K, t, y, ld_y, yi);
        tile_tok4(w2, w3, xp, K, t, y, ld_y, yi + 2);
    }
    for (; t < ntok; t++)
        for (uint32_t i = 0; i < 4; i++) tile_tok1(wbuf + (size_t)i * K, xp, K, t, y, ld_y, yi + i);
}

/* Rows 3 at a time in 3-row x 4-token tiles (the fastest here: 7 loads per 12 FMAs);
 * a remainder of one row joins the last three as a 4-row panel (a lone row would run at
 * half speed), a remainder of two is a pair. */
AVX2 void cq_gemm_avx2(const cq_matrix *w, int layout, uint32_t row0, uint32_t nrows,
                       const float *xp, uint32_t ntok, float *y, size_t ld_y, float *wbuf,
                       uint32_t wrows) {
    const uint32_t K = w->cols_pad, end = row0 + nrows;
    uint32_t r = row0;
    if (wrows >= 4 && ntok >= 4) {
        const uint32_t triples_end = nrows % 3 == 1 && nrows >= 4 ? end - 4 : end;
        /* up to PANEL_TRIPLES triples decoded at once: each 4 tokens, read from L2 once,
         * serve all of them from L1 */
        const uint32_t most = wrows / 3 < PANEL_TRIPLES ? wrows / 3 : PANEL_TRIPLES;
        while (r + 3 <= triples_end) {
            uint32_t n = (triples_end - r) / 3;
            if (n > most) n = most;
            cq_avx2_decode_rows(w, layout, r, 3 * n, wbuf);
            uint32_t t = 0;
            for (; t + 4 <= ntok; t += 4)
                for (uint32_t i = 0; i < n; i++) {
                    const float *w0 = wbuf + (size_t)3 * i * K;
                    tile3_tok4(w0, w0 + K, w0 + 2 * K, xp, K, t, y, ld_y, r + 3 * i - row0);
                }
            for (; t < ntok; t++)
                for (uint32_t i = 0; i < 3 * n; i++)
                    tile_tok1(wbuf + (size_t)i * K, xp, K, t, y, ld_y, r + i - row0);
            r += 3 * n;
        }
        if (r + 4 == end) {
            cq_avx2_decode_rows(w, layout, r, 4, wbuf);
            panel4(wbuf, K, xp, ntok, y, ld_y, r - row0);
            r += 4;
        }
    }
    for (; r < end; r += 2) {
        const int pair = r + 1 < end;
        cq_avx2_decode_rows(w, layout, r, pair ? 2 : 1, wbuf);
        const float *w0 = wbuf, *w1 = pair ? wbuf + K : NULL;
        uint32_t t = 0;
        if (pair)
            for (; t + 6 <= ntok; t += 6) tile2_tok6(w0, w1, xp, K, t, y, ld_y, r - row0);
        for (; t + 4 <= ntok; t += 4) tile_tok4(w0, w1, xp, K, t, y, ld_y, r - row0);
        for (; t < ntok; t++) {
            tile_tok1(w0, xp, K, t, y, ld_y, r - row0);
            if (pair) tile_tok1(w1, xp, K, t, y, ld_y, r + 1 - row0);
        }
    }
}

#endif
