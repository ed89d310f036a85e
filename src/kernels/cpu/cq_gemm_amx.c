/* The "amx" kernel level: the AVX-512 level with its many-token CQ products on the AMX
 * tile unit (Intel AMX-BF16), in float32 accuracy made of bf16 pieces. See
 * kernels/cpu/cq_gemm.h for the products' frame.
 *
 * Why split bf16. A tile product (tdpbf16ps) multiplies bf16 numbers (8 significant bits)
 * and accumulates in float32, about 16 times the multiply-adds per cycle of the AVX-512
 * FMA ports; bf16 weights and activations alone would cost the parity bound (1e-3 of the
 * largest logit) after 20 layers. So each float is written as hi + lo, hi = bf16(x) and
 * lo = bf16(x - hi) (together about 16 significant bits), and a product is
 * hi*hi + hi*lo + lo*hi: three tile products, still about 5 times the FMA ports' rate,
 * each term exact in float32, the dropped lo*lo below 2^-16 of it.
 *
 * Layout. Everything stays in column order (no permuted activations, unlike the AVX2
 * products). The weight rows are the tiles' A operand: a panel of 16 rows is decoded row
 * by row (cq_decode_avx512_row: level x group norm), split into hi and lo bf16 rows, and
 * each 32-column step is one 16 x 64-byte tile of each. The tokens are the B operand,
 * which the unit wants as column pairs: tile row i holds, for each of 16 tokens, the two
 * bf16 of columns 2i and 2i + 1. That copy of the activations (hi and lo, zero tokens up
 * to a multiple of 16; a 16 x 16 dword transpose per tile) is made once per batch per
 * thread and kept in the scratch as cq_scratch describes. C tiles are 16 rows x 16
 * tokens of float32; two token blocks share each A load.
 *
 * Arithmetic: every (row, token) value is the sum over 32-column steps, in order, of the
 * three tile products in the order above; the unit computes each C element from its A
 * row and B column alone, so a value depends only on the row and the token (not on the
 * panel, the token block or the thread). Denormal bf16 inputs count as zero (the unit's
 * rule). Results differ from the AVX-512 level at about 2^-16 relative per product, the
 * level the parity tests bound.
 *
 * The unit needs the OS's leave: Linux (5.16 on) grants the tile data state per process
 * on arch_prctl(ARCH_REQ_XCOMP_PERM); without it, or on other systems, the level is
 * absent. Each product loads the tile configuration and releases the tiles when done,
 * so a thread holds no tile state between products. */
#define _DEFAULT_SOURCE /* syscall(2), for arch_prctl */
#include <pthread.h>
#include <string.h>

#include "kernels/cpu/cq_decode_avx512.h"
#include "kernels/cpu/cq_gemm.h"

#if defined(__x86_64__) && defined(__linux__) &&                                           \
    ((defined(__clang__) && __clang_major__ >= 12) ||                                      \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/cpu/transpose_avx512.h"

#define AMX_TARGET "avx512f,avx512bw,avx512bf16,avx2,fma,f16c,amx-tile,amx-bf16"
#define AMX __attribute__((target(AMX_TARGET)))
#define AMX_INLINE static inline __attribute__((always_inline, target(AMX_TARGET)))

#define ROWS 16 /* weight rows per panel: one A tile's rows */
#define TOKS 16 /* tokens per block: one B tile's columns */
#define STEP 32 /* columns per tile step */

/* The tile configuration (palette 1): tiles 0-1 C (16 rows x 16 float32), 2-3 the weight
 * panel's hi and lo step (16 rows x 32 bf16), 4-7 two token blocks' hi and lo step (16
 * column pairs x 16 tokens). Every tile is 16 rows of 64 bytes. */
typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static void config_init(tile_config *c) {
    memset(c, 0, sizeof *c);
    c->palette = 1;
    for (int i = 0; i < 8; i++) {
        c->rows[i] = 16;
        c->colsb[i] = 64;
    }
}

/* x (16 floats each half) as hi bf16 pairs and the lo bf16 of x - hi: dword i of *hi is
 * (bf16(x[2i]), bf16(x[2i + 1])), the pair layout of the tiles. */
AMX_INLINE void split32(const float *x, __m512i *hi, __m512i *lo) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const __m256bh h0 = _mm512_cvtneps_pbh(x0), h1 = _mm512_cvtneps_pbh(x1);
    const __m512 f0 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h0), 16));
    const __m512 f1 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h1), 16));
    *hi = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
    *lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, f1), _mm512_sub_ps(x0, f0));
}

/* The tokens' B tiles of x (ntok rows of K floats, row stride ld_x): for block b and step
 * s, hi at bt + (b * S + s) * 512 dwords and lo 256 dwords after it (S = K / 32 steps);
 * tokens past ntok are zero. */
AMX static void token_tiles(const float *x, size_t ld_x, uint32_t ntok, uint32_t K,
                            uint32_t *bt) {
    const uint32_t S = K / STEP, nb = (ntok + TOKS - 1) / TOKS;
    for (uint32_t b = 0; b < nb; b++)
        for (uint32_t s = 0; s < S; s++) {
            __m512i hi[16], lo[16], out[16];
            for (uint32_t t = 0; t < TOKS; t++) {
                const uint32_t tok = b * TOKS + t;
                if (tok < ntok) {
                    split32(x + (size_t)tok * ld_x + (size_t)s * STEP, &hi[t], &lo[t]);
                } else {
                    hi[t] = lo[t] = _mm512_setzero_si512();
                }
            }
            uint32_t *tile = bt + ((size_t)b * S + s) * 512;
            transpose16x16_epi32(hi, out);
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(tile + 16 * i, out[i]);
            transpose16x16_epi32(lo, out);
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(tile + 256 + 16 * i, out[i]);
        }
}

/* Rows [r, r + np) of w as the panel's hi and lo bf16 rows (wh, wl: [16][K]), each row
 * decoded into `row` (K floats) first; rows past np are zero. */
AMX static void weight_rows(const cq_matrix *w, uint32_t r, uint32_t np, float *row,
                            uint16_t *wh, uint16_t *wl) {
    const uint32_t K = w->cols_pad;
    for (uint32_t n = 0; n < ROWS; n++) {
        if (n < np) cq_decode_avx512_row(w, r + n, row);
        for (uint32_t k = 0; k < K; k += STEP) {
            __m512i hi = _mm512_setzero_si512(), lo = hi;
            if (n < np) split32(row + k, &hi, &lo);
            _mm512_storeu_si512(wh + (size_t)n * K + k, hi);
            _mm512_storeu_si512(wl + (size_t)n * K + k, lo);
        }
    }
}

/* C tile c (16 rows x 16 tokens, row-major) into y: rows r0 + [0, np), tokens t0 + [0, nt). */
static void store_block(const float *c, uint32_t np, uint32_t nt, float *y, size_t ld_y,
                        uint32_t t0, uint32_t r0) {
    for (uint32_t t = 0; t < nt; t++) {
        float *o = y + (size_t)(t0 + t) * ld_y + r0;
        for (uint32_t n = 0; n < np; n++) o[n] = c[n * 16 + t];
    }
}

/* Scratch layout tag (cq_scratch.src_layout) of the token tiles, distinct from the AVX2
 * and AVX-512 ones. */
#define LAYOUT_AMX 0xA3B16u

/* Many tokens on the tile unit, or 0 (nothing written) where this matrix or scratch does
 * not suit it: the padded width not a multiple of 32, groups not of 16, or too little
 * scratch for the token tiles (ntok rounded up to 16 rows of K floats), one decoded row
 * and the panel's halves (16 rows' worth). */
AMX static int amx_products(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr,
                            size_t ld_x, uint32_t ntok, float *y, size_t ld_y,
                            cq_scratch *sc) {
    const uint32_t K = w->cols_pad, S = K / STEP, nb = (ntok + TOKS - 1) / TOKS;
    const size_t need = ((size_t)nb * TOKS + ROWS + 1) * K + 16;
    if (K % STEP || w->group % 16 || !sc || !sc->buf || sc->cap < need) return 0;
    uint32_t *bt = (uint32_t *)(((uintptr_t)sc->buf + 63) & ~(uintptr_t)63);
    float *row = (float *)bt + (size_t)nb * TOKS * K;
    uint16_t *wh = (uint16_t *)(row + K), *wl = wh + (size_t)ROWS * K;
    if (!(sc->valid && sc->src == xr && sc->src_ld == ld_x && sc->src_ntok == ntok &&
          sc->src_cols == K && sc->src_layout == LAYOUT_AMX)) {
        token_tiles(xr, ld_x, ntok, K, bt);
        sc->valid = 1;
        sc->src = xr;
        sc->src_ld = ld_x;
        sc->src_ntok = ntok;
        sc->src_cols = K;
        sc->src_layout = LAYOUT_AMX;
    }
    tile_config cfg;
    config_init(&cfg);
    _tile_loadconfig(&cfg);
    float c[2][16][16];
    for (uint32_t r = row0; r < row0 + nrows; r += ROWS) {
        const uint32_t np = row0 + nrows - r < ROWS ? row0 + nrows - r : ROWS;
        weight_rows(w, r, np, row, wh, wl);
        for (uint32_t b = 0; b < nb; b += 2) {
            const int two = b + 1 < nb;
            const uint32_t *b0 = bt + (size_t)b * S * 512, *b1 = b0 + (size_t)S * 512;
            _tile_zero(0);
            _tile_zero(1);
            for (uint32_t s = 0; s < S; s++) {
                _tile_loadd(2, wh + (size_t)s * STEP, K * sizeof(uint16_t));
                _tile_loadd(3, wl + (size_t)s * STEP, K * sizeof(uint16_t));
                _tile_loadd(4, b0 + (size_t)s * 512, 64);
                _tile_loadd(5, b0 + (size_t)s * 512 + 256, 64);
                _tile_dpbf16ps(0, 2, 4);
                _tile_dpbf16ps(0, 2, 5);
                _tile_dpbf16ps(0, 3, 4);
                if (two) {
                    _tile_loadd(6, b1 + (size_t)s * 512, 64);
                    _tile_loadd(7, b1 + (size_t)s * 512 + 256, 64);
                    _tile_dpbf16ps(1, 2, 6);
                    _tile_dpbf16ps(1, 2, 7);
                    _tile_dpbf16ps(1, 3, 6);
                }
            }
            _tile_stored(0, c[0], 64);
            if (two) _tile_stored(1, c[1], 64);
            for (int j = 0; j <= two; j++) {
                const uint32_t t0 = (b + (uint32_t)j) * TOKS;
                store_block(&c[j][0][0], np, ntok - t0 < TOKS ? ntok - t0 : TOKS, y, ld_y, t0,
                            r - row0);
            }
        }
    }
    _tile_release();
    return 1;
}

AMX static void amx_matmul(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr,
                           size_t ld_x, uint32_t ntok, float *y, size_t ld_y, cq_scratch *sc) {
    if (!nrows || !ntok) return;
    if (ntok == 1 && cq_decode_avx512(w, row0, nrows, xr, y, sc)) return;
    if (ntok > 1 && amx_products(w, row0, nrows, xr, ld_x, ntok, y, ld_y, sc)) return;
    cq_avx2_matmul_with(w, row0, nrows, xr, ld_x, ntok, y, ld_y, sc, cq_gemm_avx512);
}

/* CPUID leaf 7: AMX-BF16 (EDX bit 22), AMX-TILE (EDX bit 24); subleaf 1: AVX512-BF16
 * (EAX bit 5); AVX512BW (leaf 7 EBX bit 30). Then Linux's permission for the tile data
 * (XFEATURE_XTILEDATA, 18), which also makes XCR0 cover it. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int probe_amx(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!(d >> 22 & 1) || !(d >> 24 & 1) || !(b >> 30 & 1)) return 0;
    __cpuid_count(7, 1, a, b, c, d);
    if (!(a >> 5 & 1)) return 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    return (xlo >> 17 & 3) == 3;
}

static cpu_kernels amx_table;
static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_init(void) {
    const cpu_kernels *base = cpu_kernels_avx512();
    if (!base || !probe_amx()) return;
    amx_table = *base;
    amx_table.name = "amx";
    amx_table.matmul = amx_matmul;
    amx_table.tile_rows = ROWS;
    /* each chunk decodes and splits every weight panel once: 128 tokens a chunk instead
     * of 32 cut that share of a 256-token prefill by 4 (matrix products 111 -> 158
     * GFLOP/s on one thread of the development Xeon) */
    amx_table.prefill_chunk = 128;
    amx_ok = 1;
}

const cpu_kernels *cpu_kernels_amx(void) {
    pthread_once(&amx_once, amx_init);
    return amx_ok ? &amx_table : NULL;
}

#else

const cpu_kernels *cpu_kernels_amx(void) { return NULL; }

#endif
