/* NEON (AdvSIMD) kernels for CQ matrices on aarch64 (see kernels/cq.h and cpu.h).
 *
 * AdvSIMD, with fused multiply-add and half-precision conversion, is part of every
 * aarch64 CPU that Linux, Android or Apple run on, so this table needs no run-time probe
 * and no target attributes; on other architectures (and big-endian aarch64) the file
 * compiles to a stub that returns NULL.
 *
 * Weight decoding. A codebook level is a float, and a float is four bytes, so a codebook
 * of up to 16 levels is four 16-byte tables (byte k of every level). tbl looks up 16
 * codes at once in each table and two rounds of zips interleave the bytes back into 16
 * floats. NEON's zips interleave across the whole register, so the floats come out in
 * the order of the codes; the codes are first spread into one byte each, in column
 * order, by a tbl + per-lane shift (decode16()). Everything therefore runs in natural
 * column order: no re-laid-out activations, no cached state in the scratch.
 *
 * One token (decode): each row is decoded in registers and multiplied at once. Several
 * tokens (prefill) with scratch: each row is decoded once, norms folded in, into the
 * scratch and multiplied against the tokens in 2-row x 4-token register tiles. Several
 * tokens without scratch: each 16-column piece of a row is decoded once and multiplied
 * against up to 8 tokens.
 *
 * No dot-product instructions (SDOT/UDOT, FEAT_DotProd): they multiply int8 by int8, and
 * the activations here are float32 in the rotated domain (an int8 activation path was
 * tried and rejected because it broke parity with the reference). With float
 * activations the work is table decoding plus FMLA, which plain AdvSIMD does.
 *
 * Arithmetic: float32 throughout, summation order different from the plain kernel (and
 * between the one-token and multi-token paths), so results agree with it to float
 * rounding, not bit for bit. A row's value depends only on the row, the activations,
 * the token count and whether the scratch is large enough, never on which rows or
 * threads share the call. fwht, rotate and dequant_row are bit-identical to the plain
 * versions (same operations in the same order). */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/neon.h"

#if NEEDLE_NEON

/* ---- weight decoding ---------------------------------------------------------------- */

/* Byte k of codebook level c in T[k], for the `levels` levels the codes can name. */
static void byte_tables(const float *cb, uint32_t levels, uint8x16_t T[4]) {
    uint8_t b[4][16];
    memset(b, 0, sizeof b);
    for (uint32_t c = 0; c < levels; c++) {
        uint32_t u;
        memcpy(&u, &cb[c], sizeof u);
        for (int k = 0; k < 4; k++) b[k][c] = (uint8_t)(u >> (8 * k));
    }
    for (int k = 0; k < 4; k++) T[k] = vld1q_u8(b[k]);
}

static uint32_t levels_of(uint32_t bits) {
    return bits == 1 ? 2 : bits == 3 ? 8 : bits == 4 ? 16 : 4;
}

static inline float norm_of(const uint16_t *norms, uint32_t g) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(norms[g]))), 0);
}

/* Constants that spread packed codes into one byte per column (see decode16). */
typedef struct spread_tables {
    uint8x16_t idx;    /* 1, 2, 4 bits: the byte holding each column's code; 3 bits: the two
                        * bytes of the 16-bit window holding each of codes 0-7 */
    uint8x16_t idx_hi; /* 3 bits: the windows of codes 8-15 (3 bytes on) */
    int8x16_t shift;   /* 1, 2, 4 bits: minus the code's bit offset in its byte */
    int16x8_t shift3;  /* 3 bits: minus the code's bit offset in its window */
    uint8x16_t mask;
} spread_tables;

static void spread_tables_init(uint32_t bits, spread_tables *st) {
    uint8_t idx[16];
    int8_t sh[16];
    int16_t sh3[8];
    for (int i = 0; i < 16; i++) {
        if (bits == 1) {
            idx[i] = (uint8_t)(i / 8);
            sh[i] = (int8_t)(-(i % 8));
        } else if (bits == 4) {
            idx[i] = (uint8_t)(i / 2);
            sh[i] = (int8_t)(-4 * (i % 2));
        } else if (bits == 3) {
            idx[i] = (uint8_t)(3 * (i / 2) / 8 + i % 2); /* code i/2's byte, then the next */
            sh[i] = 0;
        } else {
            idx[i] = (uint8_t)(i / 4);
            sh[i] = (int8_t)(-2 * (i % 4));
        }
    }
    for (int i = 0; i < 8; i++) sh3[i] = (int16_t)(-((3 * i) % 8));
    st->idx = vld1q_u8(idx);
    st->idx_hi = vaddq_u8(st->idx, vdupq_n_u8(3));
    st->shift = vld1q_s8(sh);
    st->mask = vdupq_n_u8((uint8_t)(levels_of(bits) - 1));
    st->shift3 = vld1q_s16(sh3);
}

/* The 16 codes of columns [c, c + 16) of a row, one byte each, in column order. Reads
 * exactly the code bytes of those columns (c a multiple of 16). */
static inline uint8x16_t codes16(const uint8_t *codes, uint32_t bits, uint32_t c,
                                 const spread_tables *st) {
    if (bits == 1) {
        uint16_t u;
        memcpy(&u, codes + c / 8, sizeof u);
        const uint8x16_t v = vqtbl1q_u8(vreinterpretq_u8_u16(vdupq_n_u16(u)), st->idx);
        return vandq_u8(vshlq_u8(v, st->shift), st->mask);
    }
    if (bits == 4) {
        uint64_t u;
        memcpy(&u, codes + c / 2, sizeof u);
        const uint8x16_t v = vqtbl1q_u8(vreinterpretq_u8_u64(vdupq_n_u64(u)), st->idx);
        return vandq_u8(vshlq_u8(v, st->shift), st->mask);
    }
    if (bits == 3) {
        /* code i sits at bit 3i of 6 bytes: the 16-bit window at byte 3i/8, shifted right
         * by 3i % 8 (codes 8-15 repeat the pattern 3 bytes on; code 15's window reads
         * lane 6, which is zero) */
        uint64_t u = 0;
        memcpy(&u, codes + c / 8 * 3, 6);
        const uint8x16_t src = vreinterpretq_u8_u64(vdupq_n_u64(u));
        const uint16x8_t w0 = vreinterpretq_u16_u8(vqtbl1q_u8(src, st->idx));
        const uint16x8_t w1 = vreinterpretq_u16_u8(vqtbl1q_u8(src, st->idx_hi));
        const uint8x16_t n = vuzp1q_u8(vreinterpretq_u8_u16(vshlq_u16(w0, st->shift3)),
                                       vreinterpretq_u8_u16(vshlq_u16(w1, st->shift3)));
        return vandq_u8(n, st->mask);
    }
    uint32_t u;
    memcpy(&u, codes + c / 4, sizeof u);
    const uint8x16_t v = vqtbl1q_u8(vreinterpretq_u8_u32(vdupq_n_u32(u)), st->idx);
    return vandq_u8(vshlq_u8(v, st->shift), st->mask);
}

/* 16 codes (one per byte, each < 16) to 16 floats; f[q] holds codes 4q..4q+3. */
static inline void assemble(uint8x16_t idx, const uint8x16_t T[4], float32x4_t f[4]) {
    const uint8x16_t b0 = vqtbl1q_u8(T[0], idx), b1 = vqtbl1q_u8(T[1], idx);
    const uint8x16_t b2 = vqtbl1q_u8(T[2], idx), b3 = vqtbl1q_u8(T[3], idx);
    const uint16x8_t l0 = vreinterpretq_u16_u8(vzip1q_u8(b0, b1));
    const uint16x8_t l1 = vreinterpretq_u16_u8(vzip2q_u8(b0, b1));
    const uint16x8_t h0 = vreinterpretq_u16_u8(vzip1q_u8(b2, b3));
    const uint16x8_t h1 = vreinterpretq_u16_u8(vzip2q_u8(b2, b3));
    f[0] = vreinterpretq_f32_u16(vzip1q_u16(l0, h0));
    f[1] = vreinterpretq_f32_u16(vzip2q_u16(l0, h0));
    f[2] = vreinterpretq_f32_u16(vzip1q_u16(l1, h1));
    f[3] = vreinterpretq_f32_u16(vzip2q_u16(l1, h1));
}

typedef struct decoder {
    uint8x16_t T[4];
    spread_tables st;
    uint32_t bits;
} decoder;

static void decoder_init(const cq_matrix *w, decoder *d) {
    d->bits = w->bits;
    byte_tables(w->codebook, levels_of(w->bits), d->T);
    spread_tables_init(w->bits, &d->st);
}

/* The levels of columns [c, c + 16) of a row, in column order. */
static inline void decode16(const uint8_t *codes, uint32_t c, const decoder *d,
                            float32x4_t f[4]) {
    assemble(codes16(codes, d->bits, c, &d->st), d->T, f);
}

/* ---- one token: rows decoded in registers ------------------------------------------ */

static float row_tok1(const cq_matrix *w, uint32_t r, const float *x, const decoder *d) {
    const uint8_t *codes = w->codes + (size_t)r * w->row_bytes;
    const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
    const uint32_t G = w->group;
    float32x4_t total = vdupq_n_f32(0.0f), f[4];
    for (uint32_t g = 0; g < w->ngroups; g++) {
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        for (uint32_t c = g * G; c < (g + 1) * G; c += 16) {
            decode16(codes, c, d, f);
            a0 = vfmaq_f32(a0, f[0], vld1q_f32(x + c));
            a1 = vfmaq_f32(a1, f[1], vld1q_f32(x + c + 4));
            a2 = vfmaq_f32(a2, f[2], vld1q_f32(x + c + 8));
            a3 = vfmaq_f32(a3, f[3], vld1q_f32(x + c + 12));
        }
        const float32x4_t sum = vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3));
        total = vfmaq_n_f32(total, sum, norm_of(norms, g));
    }
    return vaddvq_f32(total);
}

/* ---- several tokens, no scratch: each piece of a row decoded once per 8 tokens ----- */

#define TOK_TILE 8

static void rows_natural(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr,
                         size_t ld_x, uint32_t ntok, float *y, size_t ld_y, const decoder *d) {
    const uint32_t G = w->group;
    for (uint32_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *codes = w->codes + (size_t)r * w->row_bytes;
        const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
        for (uint32_t t0 = 0; t0 < ntok; t0 += TOK_TILE) {
            const uint32_t nt = ntok - t0 < TOK_TILE ? ntok - t0 : TOK_TILE;
            const float *x = xr + t0 * ld_x;
            float32x4_t tot[TOK_TILE], acc[TOK_TILE], f[4];
            for (uint32_t i = 0; i < nt; i++) tot[i] = vdupq_n_f32(0.0f);
            for (uint32_t g = 0; g < w->ngroups; g++) {
                for (uint32_t i = 0; i < nt; i++) acc[i] = vdupq_n_f32(0.0f);
                for (uint32_t c = g * G; c < (g + 1) * G; c += 16) {
                    decode16(codes, c, d, f);
                    for (uint32_t i = 0; i < nt; i++) {
                        const float *xi = x + i * ld_x + c;
                        float32x4_t a = vfmaq_f32(acc[i], f[0], vld1q_f32(xi));
                        a = vfmaq_f32(a, f[1], vld1q_f32(xi + 4));
                        a = vfmaq_f32(a, f[2], vld1q_f32(xi + 8));
                        acc[i] = vfmaq_f32(a, f[3], vld1q_f32(xi + 12));
                    }
                }
                const float nrm = norm_of(norms, g);
                for (uint32_t i = 0; i < nt; i++) tot[i] = vfmaq_n_f32(tot[i], acc[i], nrm);
            }
            for (uint32_t i = 0; i < nt; i++) y[(t0 + i) * ld_y + (r - row0)] = vaddvq_f32(tot[i]);
        }
    }
}

/* ---- several tokens with scratch: rows decoded once into a buffer -----------------
 *
 * A row is decoded with its group norms folded in (level * norm, column order), then
 * multiplied against the tokens in register tiles of 2 rows x 4 tokens: per 4 columns, 2
 * weight and 4 activation loads feed 8 FMAs. Every (row, token) pair has one accumulator
 * over all columns in order, whichever tile computes it. */

static void decode_row_scaled(const cq_matrix *w, uint32_t r, const decoder *d, float *out) {
    const uint8_t *codes = w->codes + (size_t)r * w->row_bytes;
    const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
    const uint32_t G = w->group;
    float32x4_t f[4];
    for (uint32_t g = 0; g < w->ngroups; g++) {
        const float nrm = norm_of(norms, g);
        for (uint32_t c = g * G; c < (g + 1) * G; c += 16) {
            decode16(codes, c, d, f);
            for (int q = 0; q < 4; q++) vst1q_f32(out + c + 4 * q, vmulq_n_f32(f[q], nrm));
        }
    }
}

/* Rows w0 (and w1 if non-NULL) against tokens [t, t + 4): y[t + i][yi (+ 1)]. */
static void tile_tok4(const float *w0, const float *w1, const float *xr, size_t ld_x,
                      uint32_t cols_pad, uint32_t t, float *y, size_t ld_y, uint32_t yi) {
    const float *x0 = xr + t * ld_x, *x1 = x0 + ld_x, *x2 = x1 + ld_x, *x3 = x2 + ld_x;
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    if (w1) {
        float32x4_t b0 = vdupq_n_f32(0.0f), b1 = b0, b2 = b0, b3 = b0;
        for (uint32_t c = 0; c < cols_pad; c += 4) {
            const float32x4_t u = vld1q_f32(w0 + c), v = vld1q_f32(w1 + c);
            float32x4_t x = vld1q_f32(x0 + c);
            a0 = vfmaq_f32(a0, u, x);
            b0 = vfmaq_f32(b0, v, x);
            x = vld1q_f32(x1 + c);
            a1 = vfmaq_f32(a1, u, x);
            b1 = vfmaq_f32(b1, v, x);
            x = vld1q_f32(x2 + c);
            a2 = vfmaq_f32(a2, u, x);
            b2 = vfmaq_f32(b2, v, x);
            x = vld1q_f32(x3 + c);
            a3 = vfmaq_f32(a3, u, x);
            b3 = vfmaq_f32(b3, v, x);
        }
        y[(t + 0) * ld_y + yi + 1] = vaddvq_f32(b0);
        y[(t + 1) * ld_y + yi + 1] = vaddvq_f32(b1);
        y[(t + 2) * ld_y + yi + 1] = vaddvq_f32(b2);
        y[(t + 3) * ld_y + yi + 1] = vaddvq_f32(b3);
    } else {
        for (uint32_t c = 0; c < cols_pad; c += 4) {
            const float32x4_t u = vld1q_f32(w0 + c);
            a0 = vfmaq_f32(a0, u, vld1q_f32(x0 + c));
            a1 = vfmaq_f32(a1, u, vld1q_f32(x1 + c));
            a2 = vfmaq_f32(a2, u, vld1q_f32(x2 + c));
            a3 = vfmaq_f32(a3, u, vld1q_f32(x3 + c));
        }
    }
    y[(t + 0) * ld_y + yi] = vaddvq_f32(a0);
    y[(t + 1) * ld_y + yi] = vaddvq_f32(a1);
    y[(t + 2) * ld_y + yi] = vaddvq_f32(a2);
    y[(t + 3) * ld_y + yi] = vaddvq_f32(a3);
}

/* Row w0 against token t: y[t][yi]. */
static void tile_tok1(const float *w0, const float *xr, size_t ld_x, uint32_t cols_pad,
                      uint32_t t, float *y, size_t ld_y, uint32_t yi) {
    const float *x = xr + t * ld_x;
    float32x4_t a = vdupq_n_f32(0.0f);
    for (uint32_t c = 0; c < cols_pad; c += 4) a = vfmaq_f32(a, vld1q_f32(w0 + c), vld1q_f32(x + c));
    y[t * ld_y + yi] = vaddvq_f32(a);
}

/* ---- entry points ------------------------------------------------------------------ */

static void neon_matmul(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr,
                        size_t ld_x, uint32_t ntok, float *y, size_t ld_y, cq_scratch *sc) {
    if (!nrows || !ntok) return;
    if (w->group % 16) { /* groups are >= 16 powers of 2 in valid files; stay total anyway */
        cq_matmul(w, row0, nrows, xr, ld_x, ntok, y, ld_y);
        return;
    }
    decoder d;
    decoder_init(w, &d);
    if (ntok == 1) {
        for (uint32_t r = row0; r < row0 + nrows; r++) y[r - row0] = row_tok1(w, r, xr, &d);
        return;
    }
    const size_t cp = w->cols_pad;
    if (!sc || !sc->buf || sc->cap < 2 * cp) {
        rows_natural(w, row0, nrows, xr, ld_x, ntok, y, ld_y, &d);
        return;
    }
    /* the decoded rows overwrite whatever the scratch held */
    sc->valid = 0;
    float *w0 = sc->buf, *w1 = w0 + cp;
    for (uint32_t r = row0; r < row0 + nrows; r += 2) {
        const int pair = r + 1 < row0 + nrows;
        decode_row_scaled(w, r, &d, w0);
        if (pair) decode_row_scaled(w, r + 1, &d, w1);
        uint32_t t = 0;
        for (; t + 4 <= ntok; t += 4)
            tile_tok4(w0, pair ? w1 : NULL, xr, ld_x, w->cols_pad, t, y, ld_y, r - row0);
        for (; t < ntok; t++) {
            tile_tok1(w0, xr, ld_x, w->cols_pad, t, y, ld_y, r - row0);
            if (pair) tile_tok1(w1, xr, ld_x, w->cols_pad, t, y, ld_y, r + 1 - row0);
        }
    }
}

/* Same butterflies in the same order as the plain fwht(), so bit-identical: vld4 splits
 * 16 values into the four residues mod 4, stages 1 and 2 combine those registers, vst4
 * interleaves them back; later stages pair whole vectors. */
static void neon_fwht(float *x, uint32_t n) {
    if (n < 16) {
        fwht(x, n);
        return;
    }
    for (uint32_t i = 0; i < n; i += 16) {
        const float32x4x4_t v = vld4q_f32(x + i);
        const float32x4_t s0 = vaddq_f32(v.val[0], v.val[1]), s1 = vsubq_f32(v.val[0], v.val[1]);
        const float32x4_t s2 = vaddq_f32(v.val[2], v.val[3]), s3 = vsubq_f32(v.val[2], v.val[3]);
        float32x4x4_t o;
        o.val[0] = vaddq_f32(s0, s2);
        o.val[2] = vsubq_f32(s0, s2);
        o.val[1] = vaddq_f32(s1, s3);
        o.val[3] = vsubq_f32(s1, s3);
        vst4q_f32(x + i, o);
    }
    for (uint32_t h = 4; h < n; h <<= 1)
        for (uint32_t i = 0; i < n; i += h << 1)
            for (uint32_t j = i; j < i + h; j += 4) {
                const float32x4_t a = vld1q_f32(x + j), b = vld1q_f32(x + j + h);
                vst1q_f32(x + j, vaddq_f32(a, b));
                vst1q_f32(x + j + h, vsubq_f32(a, b));
            }
}

/* Multiplies v[0:n] by s in place (n a multiple of 4 when n >= 16). */
static void scale_in_place(float *v, uint32_t n, float s) {
    uint32_t k = 0;
    for (; k + 4 <= n; k += 4) vst1q_f32(v + k, vmulq_n_f32(vld1q_f32(v + k), s));
    for (; k < n; k++) v[k] *= s;
}

static void neon_rotate(const cq_matrix *w, const float *x, float *xr) {
    const uint32_t G = w->group;
    const float scale = 1.0f / sqrtf((float)G);
    if (xr != x) memcpy(xr, x, w->cols * sizeof *xr);
    memset(xr + w->cols, 0, (w->cols_pad - w->cols) * sizeof *xr);
    for (uint32_t g = 0; g < w->ngroups; g++) {
        float *v = xr + (size_t)g * G;
        neon_fwht(v, G);
        scale_in_place(v, G, scale);
    }
}

static void neon_dequant_row(const cq_matrix *w, uint32_t r, float *out, float *tmp) {
    const uint32_t G = w->group;
    const float scale = 1.0f / sqrtf((float)G);
    const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
    for (uint32_t g = 0; g < w->ngroups; g++) {
        cq_group_levels(w, r, g, tmp);
        scale_in_place(tmp, G, norm_of(norms, g));
        neon_fwht(tmp, G);
        scale_in_place(tmp, G, scale);
        uint32_t start = g * G, n = G;
        if (start + n > w->cols) n = w->cols - start;
        memcpy(out + start, tmp, n * sizeof *out);
    }
}

static float neon_dot(const float *a, const float *b, uint32_t n) {
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    float acc = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    for (; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void neon_axpy(float *y, float a, const float *x, uint32_t n) {
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    for (; i < n; i++) y[i] += a * x[i];
}

static const cpu_kernels neon_table = {
    .name = "neon",
    .fwht = neon_fwht,
    .rotate = neon_rotate,
    .matmul = neon_matmul,
    .dequant_row = neon_dequant_row,
    .dot = neon_dot,
    .axpy = neon_axpy,
    .attend = attn_neon,
};

#if defined(__aarch64__)
int neon_available(void) { return 1; }
#else
/* ARMv7: NEON and VFPv4 (fused multiply-add) are optional; Linux reports them in
 * AT_HWCAP (HWCAP_NEON, HWCAP_VFPv4 of asm/hwcap.h). */
#include <sys/auxv.h>
int neon_available(void) {
    const unsigned long need = (1ul << 12) | (1ul << 16);
    return (getauxval(AT_HWCAP) & need) == need;
}
#endif

const cpu_kernels *cpu_kernels_neon(void) { return neon_available() ? &neon_table : NULL; }

#else

const cpu_kernels *cpu_kernels_neon(void) { return NULL; }

#endif
