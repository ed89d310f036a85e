/* The "avx512" kernel level: the AVX2 table with its many-token CQ products on 512-bit
 * vectors (AVX-512F). See kernels/cpu/cq_gemm.h.
 *
 * The weights are decoded by the AVX2 code (once per row, so its width hardly matters);
 * the products run in 4-row x 6-token tiles of zmm accumulators: per 16 columns 4
 * weight and 6 activation loads feed 24 FMAs, 29 of the 32 vector registers; the tokens
 * past the last whole 6 in 4-token tiles of the same arithmetic. Rows or tokens short of
 * a full tile repeat the last real one and drop those results.
 *
 * One-token products go to cq_decode_avx512() (kernels/cpu/cq_decode_avx512.c).
 *
 * Arithmetic: each (row, token) pair has one 16-lane accumulator over the columns in
 * layout order, then a fixed reduction tree (16 -> 8 -> 4 lanes, then pairs). Results
 * depend only on the row and the token (not on tiles, chunks or threads), and differ
 * from the AVX2 level (8 lanes) and the plain kernel at float rounding level. */
#include <pthread.h>

#include "kernels/cpu/attn.h"
#include "kernels/cpu/cq_decode_avx512.h"
#include "kernels/cpu/cq_gemm.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

/* The sums of a, b, c, d (one row each) as lanes 0..3. */
static inline __attribute__((always_inline, target("avx512f,avx2,fma,f16c"))) __m128
sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
#define HALF(v) _mm256_add_ps(_mm512_castps512_ps256(v), \
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
    const __m256 ab = _mm256_hadd_ps(HALF(a), HALF(b)), cd = _mm256_hadd_ps(HALF(c), HALF(d));
#undef HALF
    const __m256 abcd = _mm256_hadd_ps(ab, cd); /* a0 b0 c0 d0 | a1 b1 c1 d1 (halves) */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

#define TILE_ROWS 4
#define TILE_TOKS 6

/* Rows w[0..3] against tokens x[0..5] (K columns): out[n][i] = <w[i], x[n]>. */
AVX512 static void tile4_tok6(const float *const w[TILE_ROWS], const float *const x[TILE_TOKS],
                              uint32_t K, __m128 out[TILE_TOKS]) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0;
    __m512 c0 = a0, c1 = a0, c2 = a0, c3 = a0, c4 = a0, c5 = a0;
    __m512 d0 = a0, d1 = a0, d2 = a0, d3 = a0, d4 = a0, d5 = a0;
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3], *x4 = x[4], *x5 = x[5];
    for (uint32_t k = 0; k < K; k += 16) {
        const __m512 p = _mm512_loadu_ps(w0 + k), q = _mm512_loadu_ps(w1 + k);
        const __m512 r = _mm512_loadu_ps(w2 + k), s = _mm512_loadu_ps(w3 + k);
        __m512 v;
#define TOK(n)                                                                             \
    v = _mm512_loadu_ps(x##n + k);                                                          \
    a##n = _mm512_fmadd_ps(p, v, a##n);                                                    \
    b##n = _mm512_fmadd_ps(q, v, b##n);                                                    \
    c##n = _mm512_fmadd_ps(r, v, c##n);                                                    \
    d##n = _mm512_fmadd_ps(s, v, d##n)
        TOK(0);
        TOK(1);
        TOK(2);
        TOK(3);
        TOK(4);
        TOK(5);
#undef TOK
    }
    out[0] = sum4(a0, b0, c0, d0);
    out[1] = sum4(a1, b1, c1, d1);
    out[2] = sum4(a2, b2, c2, d2);
    out[3] = sum4(a3, b3, c3, d3);
    out[4] = sum4(a4, b4, c4, d4);
    out[5] = sum4(a5, b5, c5, d5);
}

/* Rows w[0..3] against tokens x[0..3]: tile4_tok6's arithmetic for 4 tokens (16
 * accumulators), for the tokens a chunk leaves past its last whole 6 (a chunk of 32 is
 * 4 x 6 + 2 x 4 instead of 6 x 6 with 4 repeated tokens). */
AVX512 static void tile4_tok4(const float *const w[TILE_ROWS], const float *const x[4],
                              uint32_t K, __m128 out[4]) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    __m512 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
    __m512 d0 = a0, d1 = a0, d2 = a0, d3 = a0;
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    for (uint32_t k = 0; k < K; k += 16) {
        const __m512 p = _mm512_loadu_ps(w0 + k), q = _mm512_loadu_ps(w1 + k);
        const __m512 r = _mm512_loadu_ps(w2 + k), s = _mm512_loadu_ps(w3 + k);
        __m512 v;
#define TOK(n)                                                                             \
    v = _mm512_loadu_ps(x##n + k);                                                          \
    a##n = _mm512_fmadd_ps(p, v, a##n);                                                    \
    b##n = _mm512_fmadd_ps(q, v, b##n);                                                    \
    c##n = _mm512_fmadd_ps(r, v, c##n);                                                    \
    d##n = _mm512_fmadd_ps(s, v, d##n)
        TOK(0);
        TOK(1);
        TOK(2);
        TOK(3);
#undef TOK
    }
    out[0] = sum4(a0, b0, c0, d0);
    out[1] = sum4(a1, b1, c1, d1);
    out[2] = sum4(a2, b2, c2, d2);
    out[3] = sum4(a3, b3, c3, d3);
}

/* Tokens in the token tile starting at t: 6, except that 7 and 8 left are taken as 4 and
 * what remains, and 1 to 4 left as one 4-token tile (repeating its last token). */
static uint32_t tile_tokens(uint32_t left) {
    return left == 7 || left == 8 || left <= 4 ? 4 : TILE_TOKS;
}

/* Up to PANEL_TILES row tiles (12 rows: the pool's many-token chunk) are decoded at once;
 * each 6 tokens, read from L2 once, serve all of them from L1. */
#define PANEL_TILES 3

AVX512 void cq_gemm_avx512(const cq_matrix *w, int layout, uint32_t row0, uint32_t nrows,
                           const float *xp, uint32_t ntok, float *y, size_t ld_y, float *wbuf,
                           uint32_t wrows) {
    const uint32_t K = w->cols_pad, end = row0 + nrows;
    uint32_t most = wrows / TILE_ROWS < PANEL_TILES ? wrows / TILE_ROWS : PANEL_TILES;
    most = most ? most * TILE_ROWS : wrows;
    for (uint32_t r = row0; r < end; r += most) {
        const uint32_t np = end - r < most ? end - r : most;
        cq_avx2_decode_rows(w, layout, r, np, wbuf);
        for (uint32_t t = 0, width; t < ntok; t += width) {
            width = tile_tokens(ntok - t);
            const uint32_t nt = ntok - t < width ? ntok - t : width;
            const float *xt[TILE_TOKS];
            for (uint32_t n = 0; n < width; n++)
                xt[n] = xp + (size_t)(t + (n < nt ? n : nt - 1)) * K;
            for (uint32_t r0 = 0; r0 < np; r0 += TILE_ROWS) {
                const uint32_t nr = np - r0 < TILE_ROWS ? np - r0 : TILE_ROWS;
                const float *wr[TILE_ROWS];
                for (uint32_t i = 0; i < TILE_ROWS; i++)
                    wr[i] = wbuf + (size_t)(r0 + (i < nr ? i : nr - 1)) * K;
                __m128 out[TILE_TOKS];
                if (width == TILE_TOKS) tile4_tok6(wr, xt, K, out);
                else tile4_tok4(wr, xt, K, out);
                for (uint32_t n = 0; n < nt; n++) {
                    float *o = y + (size_t)(t + n) * ld_y + (r + r0 - row0);
                    if (nr == TILE_ROWS) {
                        _mm_storeu_ps(o, out[n]);
                    } else {
                        float v[4];
                        _mm_storeu_ps(v, out[n]);
                        for (uint32_t i = 0; i < nr; i++) o[i] = v[i];
                    }
                }
            }
        }
    }
}

AVX512 static void avx512_matmul(const cq_matrix *w, uint32_t row0, uint32_t nrows,
                                 const float *xr, size_t ld_x, uint32_t ntok, float *y,
                                 size_t ld_y, cq_scratch *sc) {
    /* One token: the decode kernel reads each weight once with 16-wide FMAs; it declines
     * groups that are not a multiple of 16, which then take the AVX2 path. */
    if (ntok == 1 && cq_decode_avx512(w, row0, nrows, xr, y, sc)) return;
    cq_avx2_matmul_with(w, row0, nrows, xr, ld_x, ntok, y, ld_y, sc, cq_gemm_avx512);
}

static cpu_kernels avx512_table;
static int avx512_ok;
static pthread_once_t avx512_once = PTHREAD_ONCE_INIT;

static void avx512_init(void) {
    const cpu_kernels *base = cpu_kernels_avx2();
    /* the decode kernel's probe covers this level's needs too: AVX-512F, AVX2, FMA, F16C
     * and the OS saving the opmask and ZMM state */
    if (!base || !cq_decode_avx512_supported()) return;
    avx512_table = *base;
    avx512_table.name = "avx512";
    avx512_table.matmul = avx512_matmul;
    avx512_table.attend = attn_avx512;             /* kernels/cpu/attn.h */
    avx512_table.attend_block = attn_block_avx512;
    avx512_ok = 1;
}

const cpu_kernels *cpu_kernels_avx512(void) {
    pthread_once(&avx512_once, avx512_init);
    return avx512_ok ? &avx512_table : NULL;
}

#else

const cpu_kernels *cpu_kernels_avx512(void) { return NULL; }

#endif
