/* AVX2 + FMA + F16C kernels for CQ matrices (see kernels/cq.h and kernels/cpu/cpu.h).
 *
 * Every function carries a target attribute instead of the file being built with -mavx2,
 * so the library still runs on CPUs without AVX2: cpu_kernels_avx2() returns the table
 * only after probing the CPU.
 *
 * Weight decoding. A codebook level is a float, and a float is four bytes, so a 16-entry
 * codebook is four 16-byte tables (byte k of every level). vpshufb looks up 32 codes at
 * once in each table and three rounds of unpacking interleave the bytes back into 32
 * floats (assemble()). At 2 bits the 4 levels fit one vpermilps table instead (see
 * c2_transpose), which fills the same slots with fewer shuffles. The floats come out in
 * a fixed order that is not column order; instead of reordering weights, the kernels
 * reorder the activations once per batch into the same order ("layout", see permute())
 * and keep a per-thread copy in the caller's cq_scratch. A block is the 32 code bytes
 * one vector holds: 128 columns at 2 bits (ternary crumbs too), 64 at 4 bits; this path
 * needs whole blocks per group.
 *
 * One token (decode): weights are decoded in registers and multiplied at once (a table
 * of activation sums per code byte, looked up on the scalar units for every other row,
 * was slower than this once the 2-bit decoding needed 3 instructions per 8 weights).
 * Several tokens (prefill): each row is decoded once, norms folded in, into the scratch
 * and multiplied against the tokens in register tiles (cq_gemm_avx2.c), which keeps the
 * FMA units busy.
 *
 * Everything else (1 and 3 bits, smaller groups, no scratch) takes the "natural order" path:
 * 8 consecutive codes are broadcast, shifted into lanes with vpsrlvd and looked up with
 * vpermilps / vpermps, in column order.
 *
 * Arithmetic: float32 throughout, summation order different from the plain kernel (and
 * between the one-token and multi-token paths), so results agree with it to float
 * rounding, not bit for bit. A row's value depends only on the row, the activations and
 * the scratch capacity, never on which rows or threads share the call. fwht, rotate and
 * dequant_row are bit-identical to the plain versions (same operations in the same
 * order). */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cq_gemm.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))

#include <cpuid.h>
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

enum { LAYOUT_NATURAL = 0, LAYOUT_C2 = 1, LAYOUT_C4 = 2 };

static int layout_of(const cq_matrix *w) {
    if ((w->bits == 2 || w->bits == 5) && w->group % 128 == 0) return LAYOUT_C2;
    if (w->bits == 4 && w->group % 64 == 0) return LAYOUT_C4;
    return LAYOUT_NATURAL;
}

/* ---- small helpers ------------------------------------------------------------------ */

AVX2_INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2_INLINE float norm_of(const uint16_t *norms, uint32_t g) { return _cvtsh_ss(norms[g]); }

/* Byte k of codebook level c (c taken modulo `levels`) in both 128-bit lanes of T[k]. */
AVX2_INLINE void byte_tables(const float *cb, uint32_t levels, __m256i T[4]) {
    uint8_t b[4][16];
    for (uint32_t c = 0; c < 16; c++) {
        uint32_t u;
        memcpy(&u, &cb[c % levels], sizeof u);
        for (int k = 0; k < 4; k++) b[k][c] = (uint8_t)(u >> (8 * k));
    }
    for (int k = 0; k < 4; k++)
        T[k] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)b[k]));
}

/* 32 codes (one per byte of idx, each < 16) to 32 floats. f[q] lane e holds the level of
 * byte position e < 4 ? 4q + e : 12 + 4q + e. */
AVX2_INLINE void assemble(__m256i idx, const __m256i T[4], __m256 f[4]) {
    const __m256i b0 = _mm256_shuffle_epi8(T[0], idx), b1 = _mm256_shuffle_epi8(T[1], idx);
    const __m256i b2 = _mm256_shuffle_epi8(T[2], idx), b3 = _mm256_shuffle_epi8(T[3], idx);
    const __m256i l0 = _mm256_unpacklo_epi8(b0, b1), l1 = _mm256_unpackhi_epi8(b0, b1);
    const __m256i h0 = _mm256_unpacklo_epi8(b2, b3), h1 = _mm256_unpackhi_epi8(b2, b3);
    f[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(l0, h0));
    f[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(l0, h0));
    f[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(l1, h1));
    f[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(l1, h1));
}

/* Column (within its block) of slot s of a block in `layout`: slot 32h + 8q + e holds
 * code h of byte position pos(q, e), i.e. column per_byte * pos + h. */
static uint32_t slot_column(int layout, uint32_t s) {
    const uint32_t h = s / 32, q = (s / 8) % 4, e = s % 8;
    const uint32_t pos = e < 4 ? 4 * q + e : 12 + 4 * q + e;
    return (layout == LAYOUT_C2 ? 4 : 2) * pos + h;
}

/* Activations of ntok tokens re-laid out block by block (cols_pad a multiple of the
 * block). */
static void permute(int layout, const float *xr, size_t ld_x, uint32_t ntok, uint32_t cols_pad,
                    float *xp) {
    const uint32_t block = layout == LAYOUT_C2 ? 128 : 64;
    uint8_t col[128];
    for (uint32_t s = 0; s < block; s++) col[s] = (uint8_t)slot_column(layout, s);
    for (uint32_t t = 0; t < ntok; t++) {
        const float *x = xr + t * ld_x;
        float *o = xp + (size_t)t * cols_pad;
        for (uint32_t b = 0; b < cols_pad; b += block)
            for (uint32_t s = 0; s < block; s++) o[b + s] = x[b + col[s]];
    }
}

/* ---- fast path: one token, weights decoded in registers ---------------------------- */

#define DOT4(f, x)                                                                         \
    do {                                                                                   \
        a0 = _mm256_fmadd_ps((f)[0], _mm256_load_ps((x)), a0);                             \
        a1 = _mm256_fmadd_ps((f)[1], _mm256_load_ps((x) + 8), a1);                         \
        a2 = _mm256_fmadd_ps((f)[2], _mm256_load_ps((x) + 16), a2);                        \
        a3 = _mm256_fmadd_ps((f)[3], _mm256_load_ps((x) + 24), a3);                        \
    } while (0)

/* 2-bit weights without assemble(): vpermilps reads only the low 2 bits of each dword of
 * its control, so with the 4 levels in both halves of `t4` it turns one code per dword
 * into its level directly. One vpshufb first transposes each 128-bit half as a 4x4 byte
 * matrix, so that dword e holds the 4 code bytes whose codes layout slots 8q + e (q =
 * 0..3) need; shifting by 8q + 2h then brings code h of byte q to the bottom. Per 128
 * weights: 1 byte shuffle, 15 shifts and 16 lane permutes instead of 48 shuffles, and
 * the same levels land in the same slots, so the products and sums are unchanged. */
AVX2_INLINE __m256 c2_levels(const float *cb) {
    return _mm256_setr_ps(cb[0], cb[1], cb[2], cb[3], cb[0], cb[1], cb[2], cb[3]);
}

AVX2_INLINE __m256i c2_transpose(__m256i v) {
    const __m256i tr = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm256_shuffle_epi8(v, tr);
}

/* The 8 levels of layout slots 32h + 8q .. + 7 of a transposed block t. */
#define C2_LEVELS(t, q, h) _mm256_permutevar_ps(t4, _mm256_srli_epi32((t), 8 * (q) + 2 * (h)))

/* 128 columns of one row (32 code bytes `v` at 2 bits) against xp block x, into the
 * accumulators a0..a3 (a macro so that they stay in registers), each in slot order h =
 * 0..3 as the multi-token decode stores them. */
#define C2_STEP(t, x, h)                                                                   \
    do {                                                                                   \
        a0 = _mm256_fmadd_ps(C2_LEVELS(t, 0, h), _mm256_load_ps((x) + 32 * (h)), a0);       \
        a1 = _mm256_fmadd_ps(C2_LEVELS(t, 1, h), _mm256_load_ps((x) + 32 * (h) + 8), a1);   \
        a2 = _mm256_fmadd_ps(C2_LEVELS(t, 2, h), _mm256_load_ps((x) + 32 * (h) + 16), a2);  \
        a3 = _mm256_fmadd_ps(C2_LEVELS(t, 3, h), _mm256_load_ps((x) + 32 * (h) + 24), a3);  \
    } while (0)
#define C2_BLOCK(v, x)                                                                     \
    do {                                                                                   \
        const __m256i t_ = c2_transpose(v);                                                \
        C2_STEP(t_, (x), 0);                                                               \
        C2_STEP(t_, (x), 1);                                                               \
        C2_STEP(t_, (x), 2);                                                               \
        C2_STEP(t_, (x), 3);                                                               \
    } while (0)

AVX2 static float row_c2(const cq_matrix *w, uint32_t r, const float *xp, const __m256 t4) {
    const uint8_t *codes = w->codes + (size_t)r * w->row_bytes;
    const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
    const uint32_t G = w->group;
    __m256 total = _mm256_setzero_ps();
    for (uint32_t g = 0; g < w->ngroups; g++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (uint32_t c = g * G; c < (g + 1) * G; c += 128) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(codes + c / 4));
            C2_BLOCK(v, xp + c);
        }
        const __m256 sum = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        total = _mm256_fmadd_ps(sum, _mm256_set1_ps(norm_of(norms, g)), total);
    }
    return hsum(total);
}

AVX2 static float row_c4(const cq_matrix *w, uint32_t r, const float *xp, const __m256i T[4]) {
    const uint8_t *codes = w->codes + (size_t)r * w->row_bytes;
    const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
    const __m256i m15 = _mm256_set1_epi8(15);
    const uint32_t G = w->group;
    __m256 total = _mm256_setzero_ps(), f[4];
    for (uint32_t g = 0; g < w->ngroups; g++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (uint32_t c = g * G; c < (g + 1) * G; c += 64) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(codes + c / 2));
            const float *x = xp + c;
            assemble(_mm256_and_si256(v, m15), T, f);
            DOT4(f, x);
            assemble(_mm256_and_si256(_mm256_srli_epi16(v, 4), m15), T, f);
            DOT4(f, x + 32);
        }
        const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        total = _mm256_fmadd_ps(s, _mm256_set1_ps(norm_of(norms, g)), total);
    }
    return hsum(total);
}

/* ---- fast path: several tokens, rows decoded once into a buffer -------------------
 *
 * Each row is decoded with its group norms folded in (level * norm, layout order), then
 * multiplied against the tokens by a cq_gemm_fn (cq_gemm.h): the register tiles of
 * cq_gemm_avx2.c here, those of cq_gemm_avx512.c in the avx512 level. */

AVX2 static void decode_row_scaled(const cq_matrix *w, int layout, uint32_t r,
                                   const __m256i T[4], float *out) {
    const uint8_t *codes = w->codes + (size_t)r * w->row_bytes;
    const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
    const uint32_t G = w->group;
    __m256 f[4];
    if (layout == LAYOUT_C2) {
        const __m256 t4 = c2_levels(w->codebook);
        for (uint32_t c = 0; c < w->cols_pad; c += 128) {
            const __m256 nb = _mm256_set1_ps(norm_of(norms, c / G));
            const __m256i t = c2_transpose(_mm256_loadu_si256((const __m256i *)(codes + c / 4)));
            float *o = out + c;
#define C2_STORE(q, h) _mm256_store_ps(o + 32 * (h) + 8 * (q), _mm256_mul_ps(C2_LEVELS(t, q, h), nb))
#define C2_STORE4(h) (C2_STORE(0, h), C2_STORE(1, h), C2_STORE(2, h), C2_STORE(3, h))
            C2_STORE4(0);
            C2_STORE4(1);
            C2_STORE4(2);
            C2_STORE4(3);
#undef C2_STORE4
#undef C2_STORE
        }
    } else {
        const __m256i m15 = _mm256_set1_epi8(15);
        for (uint32_t c = 0; c < w->cols_pad; c += 64) {
            const __m256 nb = _mm256_set1_ps(norm_of(norms, c / G));
            const __m256i v = _mm256_loadu_si256((const __m256i *)(codes + c / 2));
            assemble(_mm256_and_si256(v, m15), T, f);
            for (int q = 0; q < 4; q++) _mm256_store_ps(out + c + 8 * q, _mm256_mul_ps(f[q], nb));
            assemble(_mm256_and_si256(_mm256_srli_epi16(v, 4), m15), T, f);
            for (int q = 0; q < 4; q++)
                _mm256_store_ps(out + c + 32 + 8 * q, _mm256_mul_ps(f[q], nb));
        }
    }
}

/* See cq_gemm.h. */
AVX2 void cq_avx2_decode_rows(const cq_matrix *w, int layout, uint32_t r, uint32_t n, float *out) {
    __m256i T[4];
    byte_tables(w->codebook, 16, T);
    for (uint32_t i = 0; i < n; i++) decode_row_scaled(w, layout, r + i, T, out + (size_t)i * w->cols_pad);
}

/* ---- natural order: any bits, any group (a multiple of 8), no scratch -------------- */

typedef struct natural_tables {
    __m256 t2;     /* 1 bit: the 2 levels four times (vpermilps reads index bits 0-1) */
    __m256 t4;     /* 2 bits / ternary: the 4 levels twice (vpermilps) */
    __m256 lo, hi; /* 3 and 4 bits: levels 0-7 and 8-15 (vpermps) */
} natural_tables;

/* The 8 levels of columns [c, c + 8) of a row, in column order. */
AVX2_INLINE __m256 decode8(const uint8_t *codes, uint32_t bits, uint32_t c,
                           const natural_tables *nt) {
    if (bits == 1) {
        const __m256i s = _mm256_srlv_epi32(_mm256_set1_epi32(codes[c / 8]),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        return _mm256_permutevar_ps(nt->t2, s);
    }
    if (bits == 2 || bits == 5) {
        const uint32_t u = (uint32_t)codes[c / 4] | (uint32_t)codes[c / 4 + 1] << 8;
        const __m256i s = _mm256_srlv_epi32(_mm256_set1_epi32((int)u),
                                            _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
        return _mm256_permutevar_ps(nt->t4, s);
    }
    if (bits == 3) {
        const uint8_t *p = codes + c / 8 * 3;
        const uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
        const __m256i s = _mm256_srlv_epi32(_mm256_set1_epi32((int)u),
                                            _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21));
        return _mm256_permutevar8x32_ps(nt->lo, s);
    }
    uint32_t u;
    memcpy(&u, codes + c / 2, sizeof u);
    const __m256i s = _mm256_srlv_epi32(_mm256_set1_epi32((int)u),
                                        _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    const __m256 lo = _mm256_permutevar8x32_ps(nt->lo, s);
    const __m256 hi = _mm256_permutevar8x32_ps(nt->hi, s);
    return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(s, 28)));
}

/* One token in column order (1 and 3 bits, groups the layouts do not take, no scratch).
 * The codes of 8 columns are fetched with one 4-byte broadcast load straight from the
 * row (no byte assembly in general registers, which cost more than the lookup), which
 * at 1, 2 and 3 bits reads up to 3 bytes past those codes: harmless inside the code
 * array, so a row whose reads could cross its end (`tail`) takes the byte-exact loads. */
AVX2_INLINE uint32_t codes_le32(const uint8_t *p, const uint8_t *end, int tail) {
    uint32_t u = 0;
    if (!tail || end - p >= 4) {
        memcpy(&u, p, sizeof u);
        return u;
    }
    for (int i = 0; p + i < end; i++) u |= (uint32_t)p[i] << (8 * i);
    return u;
}

AVX2_INLINE __m256 natural1tok8(const uint8_t *row, const uint8_t *end, int tail, uint32_t bits,
                                uint32_t c, const natural_tables *nt) {
    if (bits == 1) {
        const __m256i v = _mm256_set1_epi32((int)codes_le32(row + c / 8, end, tail));
        return _mm256_permutevar_ps(
            nt->t2, _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    }
    if (bits == 2) {
        const __m256i v = _mm256_set1_epi32((int)codes_le32(row + c / 4, end, tail));
        return _mm256_permutevar_ps(
            nt->t4, _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)));
    }
    if (bits == 3) {
        const __m256i v = _mm256_set1_epi32((int)codes_le32(row + c / 8 * 3, end, tail));
        return _mm256_permutevar8x32_ps(
            nt->lo, _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21)));
    }
    return decode8(row, 4, c, nt);
}

/* Chunk k of 8 columns of a group goes to accumulator k % 4. */
AVX2_INLINE float natural_row_1tok(const cq_matrix *w, uint32_t r, const float *x,
                                   const uint8_t *end, int tail, uint32_t bits,
                                   const natural_tables *nt) {
    const uint8_t *row = w->codes + (size_t)r * w->row_bytes;
    const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
    const uint32_t G = w->group;
    __m256 total = _mm256_setzero_ps();
#define NAT(c, a)                                                                          \
    a = _mm256_fmadd_ps(natural1tok8(row, end, tail, bits, c, nt), _mm256_loadu_ps(x + (c)), a)
    for (uint32_t g = 0; g < w->ngroups; g++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        uint32_t c = g * G;
        const uint32_t stop = c + G;
        for (; c + 32 <= stop; c += 32) {
            NAT(c, a0);
            NAT(c + 8, a1);
            NAT(c + 16, a2);
            NAT(c + 24, a3);
        }
        if (c < stop) NAT(c, a0);
        if (c + 8 < stop) NAT(c + 8, a1);
        if (c + 16 < stop) NAT(c + 16, a2);
#undef NAT
        const __m256 sum = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        total = _mm256_fmadd_ps(sum, _mm256_set1_ps(norm_of(norms, g)), total);
    }
    return hsum(total);
}

/* Rows of one bit width (a constant after inlining); the last rows of the matrix, whose
 * 4-byte loads could pass the end of the code array, take the byte-exact loads. */
AVX2_INLINE void natural_rows_1tok(const cq_matrix *w, uint32_t row0, uint32_t nrows,
                                   const float *x, float *y, uint32_t bits,
                                   const natural_tables *nt) {
    const uint8_t *end = w->codes + (size_t)w->rows * w->row_bytes;
    for (uint32_t r = row0; r < row0 + nrows; r++) {
        const size_t left = (size_t)(end - (w->codes + (size_t)r * w->row_bytes));
        const int tail = left < (size_t)w->row_bytes + 3;
        y[r - row0] = tail ? natural_row_1tok(w, r, x, end, 1, bits, nt)
                           : natural_row_1tok(w, r, x, end, 0, bits, nt);
    }
}

#define NATURAL_TILE 8

AVX2 static void matmul_natural(const cq_matrix *w, uint32_t row0, uint32_t nrows,
                                const float *xr, size_t ld_x, uint32_t ntok, float *y,
                                size_t ld_y) {
    const uint32_t G = w->group, bits = w->bits;
    const float *cb = w->codebook;
    natural_tables nt;
    nt.t2 = _mm256_setr_ps(cb[0], cb[1], cb[0], cb[1], cb[0], cb[1], cb[0], cb[1]);
    nt.t4 = _mm256_setr_ps(cb[0], cb[1], cb[2], cb[3], cb[0], cb[1], cb[2], cb[3]);
    nt.lo = _mm256_loadu_ps(cb);
    nt.hi = _mm256_loadu_ps(cb + 8);
    if (ntok == 1) {
        switch (bits) {
        case 1: natural_rows_1tok(w, row0, nrows, xr, y, 1, &nt); return;
        case 2:
        case 5: natural_rows_1tok(w, row0, nrows, xr, y, 2, &nt); return;
        case 3: natural_rows_1tok(w, row0, nrows, xr, y, 3, &nt); return;
        default: natural_rows_1tok(w, row0, nrows, xr, y, 4, &nt); return;
        }
    }
    for (uint32_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *codes = w->codes + (size_t)r * w->row_bytes;
        const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
        for (uint32_t t0 = 0; t0 < ntok; t0 += NATURAL_TILE) {
            const uint32_t nt_tok = ntok - t0 < NATURAL_TILE ? ntok - t0 : NATURAL_TILE;
            __m256 tot[NATURAL_TILE];
            for (uint32_t i = 0; i < nt_tok; i++) tot[i] = _mm256_setzero_ps();
            for (uint32_t g = 0; g < w->ngroups; g++) {
                __m256 acc[NATURAL_TILE];
                for (uint32_t i = 0; i < nt_tok; i++) acc[i] = _mm256_setzero_ps();
                for (uint32_t c = g * G; c < (g + 1) * G; c += 8) {
                    const __m256 wv = decode8(codes, bits, c, &nt);
                    for (uint32_t i = 0; i < nt_tok; i++)
                        acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr + (t0 + i) * ld_x + c),
                                                 acc[i]);
                }
                const __m256 nb = _mm256_set1_ps(norm_of(norms, g));
                for (uint32_t i = 0; i < nt_tok; i++) tot[i] = _mm256_fmadd_ps(acc[i], nb, tot[i]);
            }
            for (uint32_t i = 0; i < nt_tok; i++) y[(t0 + i) * ld_y + (r - row0)] = hsum(tot[i]);
        }
    }
}

/* ---- entry points ------------------------------------------------------------------ */

AVX2 void cq_avx2_matmul_with(const cq_matrix *w, uint32_t row0, uint32_t nrows,
                              const float *xr, size_t ld_x, uint32_t ntok, float *y, size_t ld_y,
                              cq_scratch *sc, cq_gemm_fn gemm) {
    if (!nrows || !ntok) return;
    const int layout = layout_of(w);
    if (w->group % 8) { /* groups are >= 16 in valid files; keep the kernel total anyway */
        cq_matmul(w, row0, nrows, xr, ld_x, ntok, y, ld_y);
        return;
    }
    if (layout == LAYOUT_NATURAL || !sc || !sc->buf ||
        sc->cap < ((size_t)ntok + 2) * w->cols_pad + 16) {
        matmul_natural(w, row0, nrows, xr, ld_x, ntok, y, ld_y);
        return;
    }
    float *xp = (float *)(((uintptr_t)sc->buf + 31) & ~(uintptr_t)31);
    if (!(sc->valid && sc->src == xr && sc->src_ld == ld_x && sc->src_ntok == ntok &&
          sc->src_cols == w->cols_pad && sc->src_layout == (uint32_t)layout)) {
        permute(layout, xr, ld_x, ntok, w->cols_pad, xp);
        sc->valid = 1;
        sc->src = xr;
        sc->src_ld = ld_x;
        sc->src_ntok = ntok;
        sc->src_cols = w->cols_pad;
        sc->src_layout = (uint32_t)layout;
    }
    __m256i T[4];
    byte_tables(w->codebook, 16, T); /* the 4-bit tables (2 bits go through c2_levels) */
    const __m256 t4 = c2_levels(w->codebook);
    if (ntok == 1) {
        for (uint32_t r = row0; r < row0 + nrows; r++)
            y[r - row0] = layout == LAYOUT_C2 ? row_c2(w, r, xp, t4) : row_c4(w, r, xp, T);
        return;
    }
    const uint32_t wrows = (uint32_t)((sc->cap - 16) / w->cols_pad - ntok);
    gemm(w, layout, row0, nrows, xp, ntok, y, ld_y, xp + (size_t)ntok * w->cols_pad, wrows);
}

AVX2 static void avx2_matmul(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr,
                             size_t ld_x, uint32_t ntok, float *y, size_t ld_y,
                             cq_scratch *sc) {
    cq_avx2_matmul_with(w, row0, nrows, xr, ld_x, ntok, y, ld_y, sc, cq_gemm_avx2);
}

/* Same butterflies in the same order as the plain fwht(), so bit-identical: stages 1, 2
 * and 4 inside each vector (partner via a permute, sign via the FMA), then whole
 * vectors. */
AVX2 static void avx2_fwht(float *x, uint32_t n) {
    if (n < 8) {
        fwht(x, n);
        return;
    }
    const __m256 sg1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const __m256 sg2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const __m256 sg4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    for (uint32_t i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        v = _mm256_fmadd_ps(v, sg1, _mm256_permute_ps(v, 0xB1));
        v = _mm256_fmadd_ps(v, sg2, _mm256_permute_ps(v, 0x4E));
        v = _mm256_fmadd_ps(v, sg4, _mm256_permute2f128_ps(v, v, 1));
        _mm256_storeu_ps(x + i, v);
    }
    for (uint32_t h = 8; h < n; h <<= 1)
        for (uint32_t i = 0; i < n; i += h << 1)
            for (uint32_t j = i; j < i + h; j += 8) {
                const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
                _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
            }
}

AVX2 static void avx2_rotate(const cq_matrix *w, const float *x, float *xr) {
    const uint32_t G = w->group;
    const __m256 scale = _mm256_set1_ps(1.0f / sqrtf((float)G));
    if (xr != x) memcpy(xr, x, w->cols * sizeof *xr);
    memset(xr + w->cols, 0, (w->cols_pad - w->cols) * sizeof *xr);
    for (uint32_t g = 0; g < w->ngroups; g++) {
        float *v = xr + (size_t)g * G;
        avx2_fwht(v, G);
        for (uint32_t k = 0; k < G; k += 8)
            _mm256_storeu_ps(v + k, _mm256_mul_ps(_mm256_loadu_ps(v + k), scale));
    }
}

AVX2 static void avx2_dequant_row(const cq_matrix *w, uint32_t r, float *out, float *tmp) {
    const uint32_t G = w->group;
    const __m256 scale = _mm256_set1_ps(1.0f / sqrtf((float)G));
    const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
    for (uint32_t g = 0; g < w->ngroups; g++) {
        cq_group_levels(w, r, g, tmp);
        const __m256 nb = _mm256_set1_ps(norm_of(norms, g));
        for (uint32_t k = 0; k < G; k += 8)
            _mm256_storeu_ps(tmp + k, _mm256_mul_ps(_mm256_loadu_ps(tmp + k), nb));
        avx2_fwht(tmp, G);
        for (uint32_t k = 0; k < G; k += 8)
            _mm256_storeu_ps(tmp + k, _mm256_mul_ps(_mm256_loadu_ps(tmp + k), scale));
        uint32_t start = g * G, n = G;
        if (start + n > w->cols) n = w->cols - start;
        memcpy(out + start, tmp, n * sizeof *out);
    }
}

AVX2 static float avx2_dot(const float *a, const float *b, uint32_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    if (i + 8 <= n) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        i += 8;
    }
    float acc = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++) acc += a[i] * b[i];
    return acc;
}

AVX2 static void avx2_axpy(float *y, float a, const float *x, uint32_t n) {
    const __m256 av = _mm256_set1_ps(a);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static const cpu_kernels avx2_table = {
    .name = "avx2",
    .fwht = avx2_fwht,
    .rotate = avx2_rotate,
    .matmul = avx2_matmul,
    .dequant_row = avx2_dequant_row,
    .dot = avx2_dot,
    .axpy = avx2_axpy,
    .attend = attn_avx2,
    .attend_block = attn_block_avx2,
};

/* CPUID: AVX2 (leaf 7 EBX bit 5), FMA and F16C (leaf 1 ECX bits 12, 29), and the OS
 * saving YMM state (OSXSAVE, then XCR0 bits 1-2). */
static int cpu_has_avx2_fma_f16c(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned need1 = 1u << 12 | 1u << 27 | 1u << 28 | 1u << 29; /* FMA OSXSAVE AVX F16C */
    if ((c & need1) != need1) return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 6) != 6) return 0;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5) & 1;
}

const cpu_kernels *cpu_kernels_avx2(void) {
    static atomic_int supported = -1; /* every thread that races here stores the same value */
    int v = atomic_load_explicit(&supported, memory_order_relaxed);
    if (v < 0) {
        v = cpu_has_avx2_fma_f16c();
        atomic_store_explicit(&supported, v, memory_order_relaxed);
    }
    return v ? &avx2_table : NULL;
}

#else

const cpu_kernels *cpu_kernels_avx2(void) { return NULL; }

#endif
