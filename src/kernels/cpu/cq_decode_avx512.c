/* One-token CQ products on AVX-512F (see cq_decode_avx512.h).
 *
 * Why 512 bits help decoding more than width: vpermps on a zmm register looks up a
 * 16-entry float table, so a 4-bit code becomes its level in one instruction (AVX2 needs
 * two 8-entry lookups and a blend, or the four byte tables of cq_avx2.c and 12 shuffles
 * per 32 codes). Every bit width is decoded the same way, 16 columns at a time, in
 * column order: the code bits of the 16 columns are broadcast to all lanes (one load),
 * vpsrlvd moves code i to the bottom of lane i, and one table lookup reads it (vpermilps
 * for 1 and 2 bits, whose 4-entry table is repeated in every 128-bit lane; vpermps for 3
 * and 4 bits, reading the low 4 bits, so the 3-bit table holds the 8 levels twice). The
 * bits above the code in a lane are never read by the lookup, so no masking is needed.
 * Per 16 weights: 1 shift, 1 lookup, 1 FMA (and for 3 and 4 bits a second, masked
 * broadcast for columns 8-15).
 *
 * Arithmetic: float32; per group, four accumulators over the 16-column chunks taken in
 * turn (chunk k into accumulator k % 4), summed, scaled by the group norm into a running
 * total, which is reduced at the end (the 2-bit scratch path instead scales its lookup
 * tables by the group norm, rows_q2). The order differs from the plain kernel and from
 * the AVX2 kernels (and between the column-order and the scratch paths below), so results
 * agree with them to float rounding; a row's value depends only on the row, the
 * activations and which of the two paths the scratch allows. */
#include "kernels/cpu/cq_decode_avx512.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <cpuid.h>
#include <immintrin.h>

#include "kernels/cpu/transpose_avx512.h"

#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx2,fma,f16c")))

/* Four code bytes at p, little-endian. The 1- and 3-bit decoders load 4 bytes where
 * they need 2 or 3: harmless inside the code array, so only a row whose loads could pass
 * its end (`tail`) reads byte by byte, zero-filling (those bits belong to no column). */
AVX512_INLINE uint32_t load_le32(const uint8_t *p, const uint8_t *end, int tail) {
    uint32_t u = 0;
    if (!tail || end - p >= 4) {
        memcpy(&u, p, sizeof u);
        return u;
    }
    for (int i = 0; p + i < end; i++) u |= (uint32_t)p[i] << (8 * i);
    return u;
}

/* The levels of columns [c, c + 16) of a row whose codes start at `row`, for a bit width
 * known at compile time after inlining. */
AVX512_INLINE __m512 levels16(const uint8_t *row, const uint8_t *end, int tail, uint32_t bits,
                              uint32_t c, __m512 table) {
    if (bits == 1) {
        const __m512i sh = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i v = _mm512_set1_epi32((int)load_le32(row + c / 8, end, tail));
        return _mm512_permutevar_ps(table, _mm512_srlv_epi32(v, sh));
    }
    if (bits == 2 || bits == 5) {
        const __m512i sh = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                             28, 30);
        uint32_t u;
        memcpy(&u, row + c / 4, sizeof u); /* the 16 codes are exactly these 4 bytes */
        return _mm512_permutevar_ps(table, _mm512_srlv_epi32(_mm512_set1_epi32((int)u), sh));
    }
    if (bits == 3) {
        const __m512i sh = _mm512_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21, 0, 3, 6, 9, 12, 15, 18,
                                             21);
        const uint8_t *p = row + c / 8 * 3; /* 6 bytes: columns 0-7 in p[0..2], 8-15 in p[3..5] */
        uint32_t lo;
        memcpy(&lo, p, sizeof lo);
        const __m512i v = _mm512_mask_set1_epi32(_mm512_set1_epi32((int)lo), 0xFF00,
                                                 (int)load_le32(p + 3, end, tail));
        return _mm512_permutexvar_ps(_mm512_srlv_epi32(v, sh), table);
    }
    /* 4 bits: columns 0-7 in the first 4 bytes, 8-15 in the next 4 */
    const __m512i sh = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    const uint8_t *p = row + c / 2;
    uint32_t lo, hi;
    memcpy(&lo, p, sizeof lo);
    memcpy(&hi, p + 4, sizeof hi);
    const __m512i v = _mm512_mask_set1_epi32(_mm512_set1_epi32((int)lo), 0xFF00, (int)hi);
    return _mm512_permutexvar_ps(_mm512_srlv_epi32(v, sh), table);
}

AVX512_INLINE float row_dot(const cq_matrix *w, uint32_t r, const float *x, const uint8_t *end,
                            int tail, uint32_t bits, __m512 table) {
    const uint8_t *row = w->codes + (size_t)r * w->row_bytes;
    const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
    const uint32_t G = w->group;
    __m512 total = _mm512_setzero_ps();
    for (uint32_t g = 0; g < w->ngroups; g++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        uint32_t c = g * G;
        const uint32_t stop = c + G;
#define LV(c, a)                                                                           \
    a = _mm512_fmadd_ps(levels16(row, end, tail, bits, c, table), _mm512_loadu_ps(x + (c)), a)
        for (; c + 64 <= stop; c += 64) {
            LV(c, a0);
            LV(c + 16, a1);
            LV(c + 32, a2);
            LV(c + 48, a3);
        }
        /* groups of 16, 32 or 48 columns: chunk k still goes to accumulator k % 4 */
        if (c < stop) LV(c, a0);
        if (c + 16 < stop) LV(c + 16, a1);
        if (c + 32 < stop) LV(c + 32, a2);
#undef LV
        const __m512 s = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
        total = _mm512_fmadd_ps(s, _mm512_set1_ps(_cvtsh_ss(norms[g])), total);
    }
    return _mm512_reduce_add_ps(total);
}

/* ---- with a scratch: 64 code bits per load, activations re-laid out ---------------
 *
 * vpsrlvq shifts the 8 qword lanes of a broadcast 64-bit code word by 4j, which puts bits
 * 4j.. at the bottom of dword 2j and bits 32 + 4j.. at the bottom of dword 2j + 1: one
 * shift serves 16 lanes. At 4 bits, lane 2j then holds column j and lane 2j + 1 column
 * j + 8 of the 16. At 2 bits each lane's low nibble holds two codes: the first comes out
 * of a 16-entry table indexed by its low 2 bits (cb[i & 3]), the second out of one indexed
 * by bits 2-3 (cb[i >> 2]), so one shift serves 32 codes. The activations are permuted
 * once into the same lane order (the scratch's cached copy, like cq_avx2.c's layouts);
 * per 16 weights this leaves about 1 shift (half of one at 2 bits), 1 lookup, 1 FMA. */

/* Scratch layout tags (cq_scratch.src_layout), distinct from cq_avx2.c's. */
enum { LAYOUT_Q2 = 0x5102, LAYOUT_Q4 = 0x5104 };

/* Slot s of a block of 32 (Q2) or 16 (Q4) columns holds column slot_column(s). */
static uint32_t slot_column(int layout, uint32_t s) {
    if (layout == LAYOUT_Q4) return s % 2 ? 8 + s / 2 : s / 2;
    const uint32_t second = s / 16, lane = s % 16; /* second: the cb[i >> 2] table */
    return (lane % 2 ? 16 : 0) + 2 * (lane / 2) + second;
}

static const float *permuted(int layout, const cq_matrix *w, const float *xr, cq_scratch *sc) {
    float *xp = (float *)(((uintptr_t)sc->buf + 63) & ~(uintptr_t)63);
    if (sc->valid && sc->src == xr && sc->src_ntok == 1 && sc->src_cols == w->cols_pad &&
        sc->src_layout == (uint32_t)layout)
        return xp;
    const uint32_t block = layout == LAYOUT_Q4 ? 16 : 32;
    uint8_t col[32];
    for (uint32_t s = 0; s < block; s++) col[s] = (uint8_t)slot_column(layout, s);
    for (uint32_t b = 0; b < w->cols_pad; b += block)
        for (uint32_t s = 0; s < block; s++) xp[b + s] = xr[b + col[s]];
    sc->valid = 1;
    sc->src = xr;
    sc->src_ld = 0; /* one token: any stride gives the same copy */
    sc->src_ntok = 1;
    sc->src_cols = w->cols_pad;
    sc->src_layout = (uint32_t)layout;
    return xp;
}

AVX512_INLINE __m512i shifted_qword(const uint8_t *p) {
    const __m512i sh = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28);
    uint64_t u;
    memcpy(&u, p, sizeof u);
    return _mm512_srlv_epi64(_mm512_set1_epi64((long long)u), sh);
}

AVX512 static float row_q4(const cq_matrix *w, uint32_t r, const float *xp, __m512 table) {
    const uint8_t *row = w->codes + (size_t)r * w->row_bytes;
    const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
    const uint32_t G = w->group;
#define Q4(c, a) a = _mm512_fmadd_ps(_mm512_permutexvar_ps(shifted_qword(row + (c) / 2), table), \
                                     _mm512_load_ps(xp + (c)), a)
    __m512 total = _mm512_setzero_ps();
    for (uint32_t g = 0; g < w->ngroups; g++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        uint32_t c = g * G;
        const uint32_t stop = c + G;
        for (; c + 64 <= stop; c += 64) {
            Q4(c, a0);
            Q4(c + 16, a1);
            Q4(c + 32, a2);
            Q4(c + 48, a3);
        }
        if (c < stop) Q4(c, a0);
        if (c + 16 < stop) Q4(c + 16, a1);
        if (c + 32 < stop) Q4(c + 32, a2);
        const __m512 s = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
        total = _mm512_fmadd_ps(s, _mm512_set1_ps(_cvtsh_ss(norms[g])), total);
    }
#undef Q4
    return _mm512_reduce_add_ps(total);
}

/* NR (1 or 2) rows from r at 2 bits, each activation load serving every row. A row's
 * group norm is folded into its two lookup tables (levels * norm, rounded once per
 * group), so its two accumulators run over the whole row and no per-group sum is
 * needed: at 2 bits the lookups bound the loop, and the per-group sums and norm
 * products were a sixth of its vector work. Each row's operations and their order are
 * the same for NR 1 and 2, so the values do not depend on which rows are paired. */
AVX512_INLINE void rows_q2(const cq_matrix *w, uint32_t r, const float *xp, __m512 first,
                           __m512 second, float *y, const int NR) {
    const uint8_t *row[2];
    const uint16_t *norms[2];
    __m512 acc[2][2];
    for (int j = 0; j < NR; j++) {
        row[j] = w->codes + (size_t)(r + j) * w->row_bytes;
        norms[j] = w->norms + (size_t)(r + j) * w->ngroups;
        acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    }
    const uint32_t G = w->group; /* a multiple of 32 */
    for (uint32_t g = 0; g < w->ngroups; g++) {
        __m512 t1[2], t2[2];
        for (int j = 0; j < NR; j++) {
            const __m512 n = _mm512_set1_ps(_cvtsh_ss(norms[j][g]));
            t1[j] = _mm512_mul_ps(first, n);
            t2[j] = _mm512_mul_ps(second, n);
        }
        for (uint32_t c = g * G; c < g * G + G; c += 32) {
            const __m512 x0 = _mm512_load_ps(xp + c), x1 = _mm512_load_ps(xp + c + 16);
            for (int j = 0; j < NR; j++) {
                const __m512i sq = shifted_qword(row[j] + c / 4);
                acc[j][0] = _mm512_fmadd_ps(_mm512_permutexvar_ps(sq, t1[j]), x0, acc[j][0]);
                acc[j][1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(sq, t2[j]), x1, acc[j][1]);
            }
        }
    }
    for (int j = 0; j < NR; j++) y[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc[j][0], acc[j][1]));
}

/* ---- 2 bits, 16 rows at a time: pair tables ---------------------------------------
 *
 * Two 2-bit codes side by side are a 4-bit number, so the 16 sums a pair of columns
 * (2p, 2p + 1) can add to a row, level[c0] x[2p] + level[c1] x[2p + 1] for c0 + 4 c1 =
 * 0..15, fit one zmm table, built once per token for every pair (cols_pad / 2 tables,
 * 24 KiB at 768 columns). With the lanes of a vector being 16 rows, one vpermps then adds
 * two weights to each of 16 rows: the code words of 16 rows are loaded side by side (64
 * bytes, 256 columns, per row) and transposed, so that dword j of every row (columns 16j
 * .. 16j + 15) sits in one register, and a shift by 4i brings pair i of each to the bottom
 * of its lane (vpermps reads the low 4 bits). Per 32 weights: 1 shift, 1 lookup, 1 add
 * (and a sixth of a transpose's shuffles), against rows_q2's 1 shift, 2 lookups, 2 FMAs
 * (`bench_a8_kernels 768 768 2`, one thread of the development Xeon: 20.2 -> 16.0-16.4 us;
 * the lookups and the transposes share one port there, so not the 5/3 the count
 * suggests). The pool hands out one-token rows in multiples of 16 (cpu_matmul).
 *
 * Arithmetic: per row and group, four accumulators (pair i into accumulator i % 4) over
 * the group's dwords in order, summed, scaled by the group norm into a running total; a
 * row's lane does the same whatever rows share its block. */

enum { LAYOUT_PAIRS = 0x5123 };

/* The pair tables of xr for w's 2-bit levels, cached in the scratch (after them, the four
 * levels they were built with, so another codebook rebuilds them). */
AVX512 static const float *pair_tables(const cq_matrix *w, const float *xr, cq_scratch *sc) {
    float *T = (float *)(((uintptr_t)sc->buf + 63) & ~(uintptr_t)63);
    const uint32_t K = w->cols_pad;
    float *levels = T + (size_t)8 * K;
    if (sc->valid && sc->src == xr && sc->src_ntok == 1 && sc->src_cols == K &&
        sc->src_layout == LAYOUT_PAIRS && !memcmp(levels, w->codebook, 4 * sizeof(float)))
        return T;
    const float *cb = w->codebook;
    float lo[16], hi[16];
    for (int i = 0; i < 16; i++) lo[i] = cb[i & 3], hi[i] = cb[i >> 2];
    const __m512 l0 = _mm512_loadu_ps(lo), l1 = _mm512_loadu_ps(hi);
    for (uint32_t p = 0; p < K / 2; p++)
        _mm512_store_ps(T + (size_t)p * 16,
                        _mm512_fmadd_ps(l1, _mm512_set1_ps(xr[2 * p + 1]),
                                        _mm512_mul_ps(l0, _mm512_set1_ps(xr[2 * p]))));
    memcpy(levels, cb, 4 * sizeof(float));
    sc->valid = 1;
    sc->src = xr;
    sc->src_ld = 0;
    sc->src_ntok = 1;
    sc->src_cols = K;
    sc->src_layout = LAYOUT_PAIRS;
    return T;
}

/* Rows [r0, r0 + nr) (nr <= 16; FULL: nr == 16, known after inlining) at 2 bits from the
 * pair tables T. */
AVX512_INLINE void rows16_pairs(const cq_matrix *w, uint32_t r0, uint32_t nr, const float *T,
                                float *y, const int FULL) {
    const uint32_t rb = w->row_bytes, G = w->group, ng = w->ngroups;
    const uint8_t *codes = w->codes + (size_t)r0 * rb;
    const uint16_t *norms = w->norms + (size_t)r0 * ng;
    __m512 total = _mm512_setzero_ps(), a0 = total, a1 = total, a2 = total, a3 = total;
    uint32_t g = 0, group_end = G; /* the group being summed and its end column */
    for (uint32_t b0 = 0; b0 < rb; b0 += 64) {
        const uint32_t words = rb - b0 < 64 ? (rb - b0) / 4 : 16;
        const __mmask16 m = (__mmask16)(words == 16 ? 0xFFFFu : (1u << words) - 1);
        __m512i R[16], D[16];
        for (uint32_t i = 0; i < 16; i++)
            R[i] = FULL || i < nr ? _mm512_maskz_loadu_epi32(m, codes + (size_t)i * rb + b0)
                                  : _mm512_setzero_si512();
        transpose16x16_epi32(R, D);
        for (uint32_t j = 0; j < words; j++) {
            const uint32_t c = 4 * b0 + 16 * j; /* the word's first column */
            const float *t = T + (size_t)c * 8;  /* its first pair's table */
            const __m512i d = D[j];
            a0 = _mm512_add_ps(a0, _mm512_permutexvar_ps(d, _mm512_load_ps(t)));
            a1 = _mm512_add_ps(a1, _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), _mm512_load_ps(t + 16)));
            a2 = _mm512_add_ps(a2, _mm512_permutexvar_ps(_mm512_srli_epi32(d, 8), _mm512_load_ps(t + 32)));
            a3 = _mm512_add_ps(a3, _mm512_permutexvar_ps(_mm512_srli_epi32(d, 12), _mm512_load_ps(t + 48)));
            a0 = _mm512_add_ps(a0, _mm512_permutexvar_ps(_mm512_srli_epi32(d, 16), _mm512_load_ps(t + 64)));
            a1 = _mm512_add_ps(a1, _mm512_permutexvar_ps(_mm512_srli_epi32(d, 20), _mm512_load_ps(t + 80)));
            a2 = _mm512_add_ps(a2, _mm512_permutexvar_ps(_mm512_srli_epi32(d, 24), _mm512_load_ps(t + 96)));
            a3 = _mm512_add_ps(a3, _mm512_permutexvar_ps(_mm512_srli_epi32(d, 28), _mm512_load_ps(t + 112)));
            if (c + 16 == group_end) {
                uint16_t n16[16] = {0};
                for (uint32_t i = 0; i < (FULL ? 16 : nr); i++) n16[i] = norms[(size_t)i * ng + g];
                const __m512 n = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)n16));
                total = _mm512_fmadd_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                        n, total);
                a0 = a1 = a2 = a3 = _mm512_setzero_ps();
                g++;
                group_end += G;
            }
        }
    }
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << nr) - 1), total);
}

/* Rows r and r + 1 together, each activation load serving both (about 5% faster than
 * one row at a time at 4 bits).
 * Each row's operations and their order are row_q4's, so the values do not depend on
 * which rows are paired. */
AVX512 static void pair_q4(const cq_matrix *w, uint32_t r, const float *xp, __m512 table,
                           float *y) {
    const uint8_t *ra = w->codes + (size_t)r * w->row_bytes, *rb = ra + w->row_bytes;
    const uint16_t *na = w->norms + (size_t)r * w->ngroups, *nb = na + w->ngroups;
    const uint32_t G = w->group;
#define Q4P(c, a, b)                                                                       \
    do {                                                                                   \
        const __m512 x_ = _mm512_load_ps(xp + (c));                                        \
        a = _mm512_fmadd_ps(_mm512_permutexvar_ps(shifted_qword(ra + (c) / 2), table), x_, a); \
        b = _mm512_fmadd_ps(_mm512_permutexvar_ps(shifted_qword(rb + (c) / 2), table), x_, b); \
    } while (0)
    __m512 ta = _mm512_setzero_ps(), tb = ta;
    for (uint32_t g = 0; g < w->ngroups; g++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        uint32_t c = g * G;
        const uint32_t stop = c + G;
        for (; c + 64 <= stop; c += 64) {
            Q4P(c, a0, b0);
            Q4P(c + 16, a1, b1);
            Q4P(c + 32, a2, b2);
            Q4P(c + 48, a3, b3);
        }
        if (c < stop) Q4P(c, a0, b0);
        if (c + 16 < stop) Q4P(c + 16, a1, b1);
        if (c + 32 < stop) Q4P(c + 32, a2, b2);
        const __m512 sa = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
        const __m512 sb = _mm512_add_ps(_mm512_add_ps(b0, b1), _mm512_add_ps(b2, b3));
        ta = _mm512_fmadd_ps(sa, _mm512_set1_ps(_cvtsh_ss(na[g])), ta);
        tb = _mm512_fmadd_ps(sb, _mm512_set1_ps(_cvtsh_ss(nb[g])), tb);
    }
#undef Q4P
    y[0] = _mm512_reduce_add_ps(ta);
    y[1] = _mm512_reduce_add_ps(tb);
}

/* The level table of levels16() for w's bit width. */
AVX512_INLINE __m512 level_table(const cq_matrix *w) {
    const float *cb = w->codebook;
    switch (w->bits) {
    case 1: return _mm512_setr4_ps(cb[0], cb[1], cb[0], cb[1]);
    case 2:
    case 5: return _mm512_setr4_ps(cb[0], cb[1], cb[2], cb[3]);
    case 3:
        return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(cb))));
    default: return _mm512_loadu_ps(cb);
    }
}

/* Row r as level x group norm in column order, for a bit width known after inlining. */
AVX512_INLINE void row_levels(const cq_matrix *w, uint32_t r, float *out, uint32_t bits,
                              __m512 table) {
    const uint8_t *row = w->codes + (size_t)r * w->row_bytes;
    const uint8_t *end = w->codes + (size_t)w->rows * w->row_bytes;
    const int tail = (size_t)(end - row) < (size_t)w->row_bytes + 3;
    const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
    for (uint32_t g = 0; g < w->ngroups; g++) {
        const __m512 n = _mm512_set1_ps(_cvtsh_ss(norms[g]));
        for (uint32_t c = g * w->group; c < (g + 1) * w->group; c += 16)
            _mm512_storeu_ps(out + c, _mm512_mul_ps(levels16(row, end, tail, bits, c, table), n));
    }
}

AVX512 int cq_decode_avx512_row(const cq_matrix *w, uint32_t r, float *out) {
    if (w->group % 16 || w->bits < 1 || w->bits > 5) return 0;
    const __m512 table = level_table(w);
    switch (w->bits) {
    case 1: row_levels(w, r, out, 1, table); break;
    case 2:
    case 5: row_levels(w, r, out, 2, table); break;
    case 3: row_levels(w, r, out, 3, table); break;
    default: row_levels(w, r, out, 4, table); break;
    }
    return 1;
}

/* One specialised loop per bit width (the width is a constant inside row_dot); the last
 * rows of the matrix, whose 4-byte loads could pass the end of the codes, read exactly. */
#define DECODE_ROWS(b)                                                                     \
    for (uint32_t r = row0; r < row0 + nrows; r++) {                                       \
        const size_t left_ = (size_t)(end - (w->codes + (size_t)r * w->row_bytes));        \
        y[r - row0] = left_ < (size_t)w->row_bytes + 3 ? row_dot(w, r, xr, end, 1, b, table) \
                                                       : row_dot(w, r, xr, end, 0, b, table); \
    }

AVX512 int cq_decode_avx512(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr,
                            float *y, cq_scratch *sc) {
    if (w->group % 16) return 0;
    const float *cb = w->codebook;
    const uint8_t *end = w->codes + (size_t)w->rows * w->row_bytes;
    const int room = sc && sc->buf && sc->cap >= (size_t)w->cols_pad + 16;
    const __m512 table = level_table(w);
    switch (w->bits) {
    case 1:
        DECODE_ROWS(1);
        return 1;
    case 2:
    case 5:
        if (sc && sc->buf && sc->cap >= (size_t)8 * w->cols_pad + 32 && w->group % 16 == 0) {
            const float *T = pair_tables(w, xr, sc);
            uint32_t r = row0;
            for (; r + 16 <= row0 + nrows; r += 16) rows16_pairs(w, r, 16, T, y + (r - row0), 1);
            if (r < row0 + nrows) rows16_pairs(w, r, row0 + nrows - r, T, y + (r - row0), 0);
            return 1;
        }
        if (room && w->group % 32 == 0) {
            float first[16], second[16];
            for (int i = 0; i < 16; i++) first[i] = cb[i & 3], second[i] = cb[i >> 2];
            const __m512 t1 = _mm512_loadu_ps(first), t2 = _mm512_loadu_ps(second);
            const float *xp = permuted(LAYOUT_Q2, w, xr, sc);
            uint32_t r = row0;
            for (; r + 2 <= row0 + nrows; r += 2) rows_q2(w, r, xp, t1, t2, y + (r - row0), 2);
            if (r < row0 + nrows) rows_q2(w, r, xp, t1, t2, y + (r - row0), 1);
            return 1;
        }
        DECODE_ROWS(2);
        return 1;
    case 3:
        DECODE_ROWS(3);
        return 1;
    case 4:
        if (room) {
            const float *xp = permuted(LAYOUT_Q4, w, xr, sc);
            uint32_t r = row0;
            for (; r + 2 <= row0 + nrows; r += 2) pair_q4(w, r, xp, table, y + (r - row0));
            if (r < row0 + nrows) y[r - row0] = row_q4(w, r, xp, table);
            return 1;
        }
        DECODE_ROWS(4);
        return 1;
    default:
        return 0;
    }
}

/* CPUID: FMA, OSXSAVE, AVX, F16C (leaf 1 ECX bits 12, 27, 28, 29); the OS saving the
 * XMM, YMM, opmask and both ZMM halves (XCR0 bits 1, 2, 5, 6, 7); AVX2 and AVX-512F
 * (leaf 7 EBX bits 5 and 16). */
static int probe_avx512f(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned need1 = 1u << 12 | 1u << 27 | 1u << 28 | 1u << 29;
    if ((c & need1) != need1) return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0xE6) != 0xE6) return 0;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5 & 1) && (b >> 16 & 1);
}

int cq_decode_avx512_supported(void) {
    static atomic_int supported = -1; /* racing threads all store the same value */
    int v = atomic_load_explicit(&supported, memory_order_relaxed);
    if (v < 0) {
        v = probe_avx512f();
        atomic_store_explicit(&supported, v, memory_order_relaxed);
    }
    return v;
}

#else

int cq_decode_avx512_supported(void) { return 0; }

int cq_decode_avx512(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr,
                     float *y, cq_scratch *sc) {
    (void)w, (void)row0, (void)nrows, (void)xr, (void)y, (void)sc;
    return 0;
}

int cq_decode_avx512_row(const cq_matrix *w, uint32_t r, float *out) {
    (void)w, (void)r, (void)out;
    return 0;
}

#endif
