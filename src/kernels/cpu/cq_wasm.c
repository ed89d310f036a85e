/* WebAssembly SIMD128 kernels for CQ matrices (the "simd128" level; see kernels/cq.h and
 * cpu.h).
 *
 * A WebAssembly engine either validates SIMD instructions or rejects the whole module, so
 * there is no run-time probe: the level exists in builds compiled with -msimd128 (the WASI
 * build's default, NEEDLE_WASM_SIMD) and this file is a stub returning NULL elsewhere.
 *
 * Weight decoding as in the NEON kernels (cq_neon.c): a codebook level is four bytes, so
 * up to 16 levels are four 16-byte tables (byte k of every level); i8x16.swizzle looks up
 * 16 codes in each, and two rounds of byte/halfword interleaving shuffles rebuild the 16
 * floats in column order. SIMD128 has no per-lane variable shift, so the codes are spread
 * one per byte with a swizzle (the byte holding each column's code) and then, for 4 and
 * 2 bits, the lanes are picked from whole-vector shifts by constant lane masks; 1 bit is
 * a per-lane bit test. 3-bit codes (8 per 3 bytes) are unpacked by the portable decoder.
 *
 * Products: each row is decoded 16 columns at a time, once per tile of up to 4 tokens, and
 * multiplied against the tile (no scratch: the activations stay in column order).
 * Arithmetic: float32, multiply then add (SIMD128 has no fused multiply-add), summed in
 * another order than the plain kernel, so results agree with it to float rounding, not bit
 * for bit; a row's value depends only on the row, the activations and the token count,
 * never on which rows share the call. fwht, rotate, dequant_row and attention are the
 * portable ones (bit-identical by construction). */
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "util/fp16.h"

#if defined(__wasm_simd128__)

#include <wasm_simd128.h>

/* ---- weight decoding ---------------------------------------------------------------- */

typedef struct decoder {
    v128_t T[4];    /* byte k of every codebook level */
    v128_t spread;  /* the byte holding each of 16 columns' codes (1, 2, 4 bits) */
    v128_t sel[4];  /* 2 bits: lanes whose code sits at bit 2j; 4 bits: sel[1] = odd lanes;
                     * 1 bit: sel[0] = each lane's bit */
    uint32_t bits;
} decoder;

static void decoder_init(const cq_matrix *w, decoder *d) {
    d->bits = w->bits;
    const uint32_t levels = w->bits == 1 ? 2 : w->bits == 3 ? 8 : w->bits == 4 ? 16 : 4;
    uint8_t b[4][16], idx[16], sel[4][16];
    memset(b, 0, sizeof b);
    memset(sel, 0, sizeof sel);
    for (uint32_t c = 0; c < levels; c++) {
        uint32_t u;
        memcpy(&u, &w->codebook[c], sizeof u);
        for (int k = 0; k < 4; k++) b[k][c] = (uint8_t)(u >> (8 * k));
    }
    for (int i = 0; i < 16; i++) {
        if (w->bits == 1) {
            idx[i] = (uint8_t)(i / 8);
            sel[0][i] = (uint8_t)(1u << (i % 8));
        } else if (w->bits == 4) {
            idx[i] = (uint8_t)(i / 2);
            sel[1][i] = i % 2 ? 0xff : 0;
        } else {
            idx[i] = (uint8_t)(i / 4);
            sel[i % 4][i] = 0xff;
        }
    }
    for (int k = 0; k < 4; k++) {
        d->T[k] = wasm_v128_load(b[k]);
        d->sel[k] = wasm_v128_load(sel[k]);
    }
    d->spread = wasm_v128_load(idx);
}

/* The 16 codes of columns [c, c + 16) of a row, one byte each, in column order. Reads
 * exactly the code bytes of those columns (c a multiple of 16). Not for 3 bits. */
static inline v128_t codes16(const uint8_t *codes, uint32_t c, const decoder *d) {
    if (d->bits == 4) {
        uint64_t u;
        memcpy(&u, codes + c / 2, sizeof u);
        const v128_t v = wasm_i8x16_swizzle(wasm_u64x2_splat(u), d->spread);
        const v128_t lo = wasm_v128_and(v, wasm_u8x16_splat(15));
        return wasm_v128_bitselect(wasm_u8x16_shr(v, 4), lo, d->sel[1]);
    }
    if (d->bits == 1) {
        uint16_t u;
        memcpy(&u, codes + c / 8, sizeof u);
        const v128_t v = wasm_i8x16_swizzle(wasm_u16x8_splat(u), d->spread);
        const v128_t set = wasm_i8x16_ne(wasm_v128_and(v, d->sel[0]), wasm_u8x16_splat(0));
        return wasm_v128_and(set, wasm_u8x16_splat(1));
    }
    /* 2 bits (and ternary, stored as 2-bit crumbs): code j of a byte at bit 2j */
    uint32_t u;
    memcpy(&u, codes + c / 4, sizeof u);
    const v128_t v = wasm_i8x16_swizzle(wasm_u32x4_splat(u), d->spread);
    v128_t n = wasm_v128_and(v, d->sel[0]);
    n = wasm_v128_or(n, wasm_v128_and(wasm_u8x16_shr(v, 2), d->sel[1]));
    n = wasm_v128_or(n, wasm_v128_and(wasm_u8x16_shr(v, 4), d->sel[2]));
    n = wasm_v128_or(n, wasm_v128_and(wasm_u8x16_shr(v, 6), d->sel[3]));
    return wasm_v128_and(n, wasm_u8x16_splat(3));
}

/* 16 codes (one per byte, each < 16) to 16 floats in column order; f[q]: codes 4q..4q+3. */
static inline void assemble(v128_t idx, const v128_t T[4], v128_t f[4]) {
    const v128_t b0 = wasm_i8x16_swizzle(T[0], idx), b1 = wasm_i8x16_swizzle(T[1], idx);
    const v128_t b2 = wasm_i8x16_swizzle(T[2], idx), b3 = wasm_i8x16_swizzle(T[3], idx);
    /* bytes 0,1 and 2,3 of each float side by side, then the two halves together */
    const v128_t l0 = wasm_i8x16_shuffle(b0, b1, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const v128_t l1 = wasm_i8x16_shuffle(b0, b1, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const v128_t h0 = wasm_i8x16_shuffle(b2, b3, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const v128_t h1 = wasm_i8x16_shuffle(b2, b3, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    f[0] = wasm_i16x8_shuffle(l0, h0, 0, 8, 1, 9, 2, 10, 3, 11);
    f[1] = wasm_i16x8_shuffle(l0, h0, 4, 12, 5, 13, 6, 14, 7, 15);
    f[2] = wasm_i16x8_shuffle(l1, h1, 0, 8, 1, 9, 2, 10, 3, 11);
    f[3] = wasm_i16x8_shuffle(l1, h1, 4, 12, 5, 13, 6, 14, 7, 15);
}

/* The levels of columns [c, c + 16) of a row, in column order. */
static inline void decode16(const cq_matrix *w, const uint8_t *codes, uint32_t c,
                            const decoder *d, v128_t f[4]) {
    if (d->bits == 3) {
        /* 16 columns of 3-bit codes: 6 bytes, two 24-bit words of 8 codes */
        const uint8_t *p = codes + c / 8 * 3;
        float lv[16];
        for (int half = 0; half < 2; half++, p += 3) {
            const uint32_t word = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16);
            for (int i = 0; i < 8; i++) lv[8 * half + i] = w->codebook[(word >> (3 * i)) & 7];
        }
        for (int q = 0; q < 4; q++) f[q] = wasm_v128_load(lv + 4 * q);
        return;
    }
    assemble(codes16(codes, c, d), d->T, f);
}

static inline float hsum(v128_t v) {
    return (wasm_f32x4_extract_lane(v, 0) + wasm_f32x4_extract_lane(v, 1)) +
           (wasm_f32x4_extract_lane(v, 2) + wasm_f32x4_extract_lane(v, 3));
}

/* ---- products ------------------------------------------------------------------------- */

#define TOK_TILE 4

static void wasm_matmul(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr,
                        size_t ld_x, uint32_t ntok, float *y, size_t ld_y, cq_scratch *scratch) {
    (void)scratch;
    decoder d;
    decoder_init(w, &d);
    const uint32_t G = w->group;
    for (uint32_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *codes = w->codes + (size_t)r * w->row_bytes;
        const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
        for (uint32_t t0 = 0; t0 < ntok; t0 += TOK_TILE) {
            const uint32_t nt = ntok - t0 < TOK_TILE ? ntok - t0 : TOK_TILE;
            v128_t total[TOK_TILE];
            for (uint32_t t = 0; t < TOK_TILE; t++) total[t] = wasm_f32x4_splat(0.0f);
            for (uint32_t g = 0; g < w->ngroups; g++) {
                v128_t acc[TOK_TILE][2];
                for (uint32_t t = 0; t < TOK_TILE; t++) acc[t][0] = acc[t][1] = wasm_f32x4_splat(0.0f);
                for (uint32_t c = g * G; c < (g + 1) * G; c += 16) {
                    v128_t f[4];
                    decode16(w, codes, c, &d, f);
                    for (uint32_t t = 0; t < nt; t++) {
                        const float *x = xr + (size_t)(t0 + t) * ld_x + c;
                        acc[t][0] = wasm_f32x4_add(acc[t][0], wasm_f32x4_mul(f[0], wasm_v128_load(x)));
                        acc[t][1] = wasm_f32x4_add(acc[t][1], wasm_f32x4_mul(f[1], wasm_v128_load(x + 4)));
                        acc[t][0] = wasm_f32x4_add(acc[t][0], wasm_f32x4_mul(f[2], wasm_v128_load(x + 8)));
                        acc[t][1] = wasm_f32x4_add(acc[t][1], wasm_f32x4_mul(f[3], wasm_v128_load(x + 12)));
                    }
                }
                const v128_t norm = wasm_f32x4_splat(fp16_to_f32(norms[g]));
                for (uint32_t t = 0; t < nt; t++)
                    total[t] = wasm_f32x4_add(total[t],
                                              wasm_f32x4_mul(wasm_f32x4_add(acc[t][0], acc[t][1]), norm));
            }
            for (uint32_t t = 0; t < nt; t++) y[(size_t)(t0 + t) * ld_y + (r - row0)] = hsum(total[t]);
        }
    }
}

static float wasm_dot(const float *a, const float *b, uint32_t n) {
    v128_t s0 = wasm_f32x4_splat(0.0f), s1 = s0;
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 = wasm_f32x4_add(s0, wasm_f32x4_mul(wasm_v128_load(a + i), wasm_v128_load(b + i)));
        s1 = wasm_f32x4_add(s1, wasm_f32x4_mul(wasm_v128_load(a + i + 4), wasm_v128_load(b + i + 4)));
    }
    float acc = hsum(wasm_f32x4_add(s0, s1));
    for (; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* y[i] += a * x[i], element by element as the plain version (no fused multiply-add) */
static void wasm_axpy(float *y, float a, const float *x, uint32_t n) {
    const v128_t va = wasm_f32x4_splat(a);
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4)
        wasm_v128_store(y + i, wasm_f32x4_add(wasm_v128_load(y + i),
                                              wasm_f32x4_mul(va, wasm_v128_load(x + i))));
    for (; i < n; i++) y[i] += a * x[i];
}

static const cpu_kernels wasm_table = {
    .name = "simd128",
    .fwht = fwht,
    .rotate = cq_rotate,
    .matmul = wasm_matmul,
    .dequant_row = cq_dequant_row,
    .dot = wasm_dot,
    .axpy = wasm_axpy,
    .attend = attn_plain,
};

const cpu_kernels *cpu_kernels_simd128(void) { return &wasm_table; }

#else

const cpu_kernels *cpu_kernels_simd128(void) { return NULL; }

#endif
