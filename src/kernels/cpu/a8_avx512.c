/* AVX-512 VNNI W·A8 kernels for 2-bit codes (CQ2 and ternary crumbs; see a8.h).
 *
 * Why this beats the AVX2 kernel: the plane sums of a8.h need, per column, a mask of each
 * code bit and an add of the selected activations. Here 32 columns' codes are one 64-bit
 * word; pext pulls the even (b0) and odd (b1) bits out as two 32-bit masks straight into
 * opmask registers (kxor gives b0^b1), a zero-masking move selects the int16 activations
 * of a plane, and one vpdpwssd against ones adds pairs of them into int32. Per 32 columns
 * and plane: 2 vector instructions (the AVX2 kernel spends ~8 per 16 columns on building
 * and applying byte masks), and the masks of a block serve every token.
 *
 * Exactness: the plane sums are integers (|z| <= 128·G, a group's sum < 2^31), so the
 * order of the adds does not matter; the float combination is a8.h's fmaf sequence, as
 * in the scalar kernel. Results are bit-identical to every other level and every thread
 * count. 4 bits: vpermw indicator lookups (tile16_one_token_4bit), token by token. Other
 * widths (1, 3 bits) and groups not a multiple of 32 take the AVX2 kernel. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/cpu/a8.h"
#include "kernels/cpu/cq_decode_avx512.h"
#include "util/fp16.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <cpuid.h>
#include <immintrin.h>

#define VNNI512 __attribute__((target("avx512f,avx512bw,avx512vnni,bmi2,avx2,fma")))
#define VNNI512_INLINE \
    static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vnni,bmi2,avx2,fma")))

/* The float combination of a8.h for one group of one token (the scalar kernel's). */
static inline float combine(const a8_planes *P, int32_t T, const int32_t *q) {
    float d = P->cb0 * (float)T;
    for (uint32_t p = 0; p < P->n; p++) d = fmaf(P->coef[p], (float)q[p], d);
    return d;
}

/* Masks of the three planes (b0, b1, b0^b1) of the 32 columns whose codes are `c`. */
VNNI512_INLINE void masks32(uint64_t c, __mmask32 *m1, __mmask32 *m2, __mmask32 *m3) {
    *m1 = (__mmask32)_pext_u64(c, 0x5555555555555555ull);
    *m2 = (__mmask32)_pext_u64(c, 0xAAAAAAAAAAAAAAAAull);
    *m3 = *m1 ^ *m2;
}

/* Sums of the lanes of four vectors: out[i] = sum of v[i]. Exact (int32, wrapping never
 * happens: a group's plane sum is below 128·128·128). */
VNNI512_INLINE void hsum4(__m512i a, __m512i b, __m512i c, __m512i d, int32_t out[4]) {
    const __m256i a8 = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
    const __m256i b8 = _mm256_add_epi32(_mm512_castsi512_si256(b), _mm512_extracti64x4_epi64(b, 1));
    const __m256i c8 = _mm256_add_epi32(_mm512_castsi512_si256(c), _mm512_extracti64x4_epi64(c, 1));
    const __m256i d8 = _mm256_add_epi32(_mm512_castsi512_si256(d), _mm512_extracti64x4_epi64(d, 1));
    const __m256i ab = _mm256_hadd_epi32(a8, b8);   /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    const __m256i cd = _mm256_hadd_epi32(c8, d8);
    const __m256i abcd = _mm256_hadd_epi32(ab, cd); /* a b c d (low half) | a b c d (high) */
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
    _mm_storeu_si128((__m128i *)(void *)out, s);
}

/* One token, rows [r0, r0 + n), n <= 16, one row per lane: the integer plane sums of a
 * group row by row, then the float combination of a8.h for the 16 rows at once (lane i
 * runs row i's fmaf sequence, so the rounding is the scalar kernel's). */
/* The sums of 16 vectors at once: lane S of the result is the sum of the lanes of v[S]
 * (45 instructions, against 80 for four hsum4). */
VNNI512_INLINE __m512i hsum16(const __m512i v[16]) {
    __m512i t[8], u[4];
    for (int i = 0; i < 8; i++) /* per 128-bit lane: v[2i], v[2i+1] interleaved */
        t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* per 128-bit lane: v[4i..4i+3], that lane's sums */
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]),
                                _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
    /* add the four 128-bit lanes of each u[i] and put u[i]'s into lane i */
    const __m512i w01 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x88),
                                         _mm512_shuffle_i32x4(u[0], u[1], 0xDD));
    const __m512i w23 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2], u[3], 0x88),
                                         _mm512_shuffle_i32x4(u[2], u[3], 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(w01, w23, 0x88),
                            _mm512_shuffle_i32x4(w01, w23, 0xDD));
}

static VNNI512 void tile16_one_token(const cq_matrix *w, const a8_planes *P, uint32_t r0,
                                     uint32_t n, const float *xr, float *y) {
    const uint32_t G = w->group, nb = G / 32;
    const int16_t *z = (const int16_t *)(const void *)(xr + a8_row_z_offset(w->cols_pad, G));
    const int32_t *sums = a8_row_sums_c(xr);
    const __m512i ones = _mm512_set1_epi16(1);
    /* q[4i + S]: plane S (1..3) of row i, four rows to one reduction (hsum16) */
    int32_t q[64] __attribute__((aligned(64)));
    uint16_t nh[16] __attribute__((aligned(32)));
    memset(nh, 0, sizeof nh);
    const __m512i row_index = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(4));
    __m512 acc = _mm512_setzero_ps();
    for (uint32_t g = 0; g < w->ngroups; g++) {
        const int16_t *zg = z + (size_t)g * G;
        for (uint32_t i0 = 0; i0 < 16; i0 += 4) {
            __m512i v[16];
            for (uint32_t j = 0; j < 16; j++) v[j] = _mm512_setzero_si512();
            for (uint32_t j = 0; j < 4 && i0 + j < n; j++) {
                const uint32_t i = i0 + j;
                const uint8_t *cg = w->codes + (size_t)(r0 + i) * w->row_bytes + (size_t)g * G / 4;
                nh[i] = w->norms[(size_t)(r0 + i) * w->ngroups + g];
                __m512i a1 = _mm512_setzero_si512(), a2 = a1, a3 = a1;
                for (uint32_t b = 0; b < nb; b++) {
                    uint64_t c;
                    memcpy(&c, cg + 8 * b, sizeof c);
                    __mmask32 k1, k2, k3;
                    masks32(c, &k1, &k2, &k3);
                    const __m512i zz = _mm512_loadu_si512((const void *)(zg + 32 * b));
                    a1 = _mm512_dpwssd_epi32(a1, _mm512_maskz_mov_epi16(k1, zz), ones);
                    a2 = _mm512_dpwssd_epi32(a2, _mm512_maskz_mov_epi16(k2, zz), ones);
                    a3 = _mm512_dpwssd_epi32(a3, _mm512_maskz_mov_epi16(k3, zz), ones);
                }
                v[4 * j + 1] = a1;
                v[4 * j + 2] = a2;
                v[4 * j + 3] = a3;
            }
            _mm512_store_si512((void *)(q + 4 * i0), hsum16(v));
        }
        __m512 d = _mm512_set1_ps(P->cb0 * (float)sums[g]);
        for (uint32_t p = 0; p < P->n; p++) {
            const __m512i qS = _mm512_i32gather_epi32(
                _mm512_add_epi32(row_index, _mm512_set1_epi32(P->sel[p])), (const void *)q, 4);
            d = _mm512_fmadd_ps(_mm512_set1_ps(P->coef[p]), _mm512_cvtepi32_ps(qS), d);
        }
        const __m512 norm = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)nh));
        acc = _mm512_fmadd_ps(norm, d, acc);
    }
    const float st = a8_row_scale(xr) * (1.0f / sqrtf((float)G));
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << n) - 1), _mm512_mul_ps(acc, _mm512_set1_ps(st)));
}

/* 4 bits, one token, rows [r0, r0 + n), n <= 16, one row per lane as tile16_one_token.
 * A plane's 0/1 indicator of 32 columns is one vpermw lookup of their codes (the column's
 * code byte shifted so that its code is in the low 4 bits; vpermw reads 5 bits, so the
 * 32-entry tables hold the 16 values twice) and one vpdpwssd adds the selected
 * activations: 2 instructions per plane per 32 columns, 15 planes. */
static VNNI512 void tile16_one_token_4bit(const cq_matrix *w, const a8_planes *P, uint32_t r0,
                                          uint32_t n, const float *xr, float *y) {
    const uint32_t G = w->group, nb = G / 32;
    const int16_t *z = (const int16_t *)(const void *)(xr + a8_row_z_offset(w->cols_pad, G));
    const int32_t *sums = a8_row_sums_c(xr);
    /* every plane S = 1..15 (a constant count keeps the 15 accumulators in registers);
     * the combination reads the ones the book uses */
    int16_t tab[16][32] __attribute__((aligned(64)));
    for (uint32_t S = 0; S < 16; S++)
        for (uint32_t i = 0; i < 32; i++)
            tab[S][i] = (int16_t)(__builtin_popcount((i & 15u) & S) & 1);
    /* word j of each 128-bit lane (column 8L + j) takes byte 4L + j/2; high byte zero */
    const __m512i spread = _mm512_set_epi8(
        -1, 15, -1, 15, -1, 14, -1, 14, -1, 13, -1, 13, -1, 12, -1, 12,
        -1, 11, -1, 11, -1, 10, -1, 10, -1, 9, -1, 9, -1, 8, -1, 8,
        -1, 7, -1, 7, -1, 6, -1, 6, -1, 5, -1, 5, -1, 4, -1, 4,
        -1, 3, -1, 3, -1, 2, -1, 2, -1, 1, -1, 1, -1, 0, -1, 0);
    const __m512i nib = _mm512_set_epi16(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0,
                                         4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
    /* qt[i][S]: plane S of row i; rows past n stay zero */
    int32_t qt[16][16] __attribute__((aligned(64)));
    uint16_t nh[16] __attribute__((aligned(32)));
    memset(qt, 0, sizeof qt);
    memset(nh, 0, sizeof nh);
    const __m512i row_index = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(16));
    __m512 acc = _mm512_setzero_ps();
    for (uint32_t g = 0; g < w->ngroups; g++) {
        const int16_t *zg = z + (size_t)g * G;
        for (uint32_t i = 0; i < n; i++) {
            const uint8_t *cg = w->codes + (size_t)(r0 + i) * w->row_bytes + (size_t)g * G / 2;
            nh[i] = w->norms[(size_t)(r0 + i) * w->ngroups + g];
            __m512i a[16];
            for (uint32_t S = 0; S < 16; S++) a[S] = _mm512_setzero_si512();
            for (uint32_t b = 0; b < nb; b++) {
                const __m512i bytes =
                    _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)(cg + 16 * b)));
                const __m512i idx = _mm512_srlv_epi16(_mm512_shuffle_epi8(bytes, spread), nib);
                const __m512i zz = _mm512_loadu_si512((const void *)(zg + 32 * b));
                for (uint32_t S = 1; S < 16; S++)
                    a[S] = _mm512_dpwssd_epi32(
                        a[S], zz, _mm512_permutexvar_epi16(idx, _mm512_load_si512((const void *)tab[S])));
            }
            _mm512_store_si512((void *)qt[i], hsum16(a));
        }
        __m512 d = _mm512_set1_ps(P->cb0 * (float)sums[g]);
        for (uint32_t p = 0; p < P->n; p++) {
            /* plane S of the 16 rows: column S of qt */
            const __m512i qS = _mm512_i32gather_epi32(
                _mm512_add_epi32(row_index, _mm512_set1_epi32(P->sel[p])), (const void *)qt, 4);
            d = _mm512_fmadd_ps(_mm512_set1_ps(P->coef[p]), _mm512_cvtepi32_ps(qS), d);
        }
        const __m512 norm = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)nh));
        acc = _mm512_fmadd_ps(norm, d, acc);
    }
    const float st = a8_row_scale(xr) * (1.0f / sqrtf((float)G));
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << n) - 1), _mm512_mul_ps(acc, _mm512_set1_ps(st)));
}

static VNNI512 void vnni_matmul(const cq_matrix *w, uint32_t row0, uint32_t nrows,
                                const float *rows, size_t ld, uint32_t ntok, float *y,
                                size_t ld_y) {
    const uint32_t G = w->group;
    if (G % 32 == 0 && w->bits == 4) {
        /* several tokens one after another: still ~2.5x the AVX2 per-code sums */
        a8_planes P;
        a8_planes_of(w, &P);
        for (uint32_t t = 0; t < ntok; t++)
            for (uint32_t r = row0; r < row0 + nrows; r += 16)
                tile16_one_token_4bit(w, &P, r, row0 + nrows - r < 16 ? row0 + nrows - r : 16,
                                      rows + t * ld, y + t * ld_y + (r - row0));
        return;
    }
    if (G % 32 || (w->bits != 2 && w->bits != 5)) {
        a8_kernels_avx2()->matmul(w, row0, nrows, rows, ld, ntok, y, ld_y);
        return;
    }
    a8_planes P;
    a8_planes_of(w, &P);
    if (ntok == 1) {
        for (uint32_t r = row0; r < row0 + nrows; r += 16)
            tile16_one_token(w, &P, r, row0 + nrows - r < 16 ? row0 + nrows - r : 16, rows,
                             y + (r - row0));
        return;
    }
    const size_t zoff = a8_row_z_offset(w->cols_pad, G);
    const float rsg = 1.0f / sqrtf((float)G);
    const uint32_t nb = G / 32;
    const __m512i ones = _mm512_set1_epi16(1);
    __mmask32 km[4][A8_MAX_GROUP / 32];
    for (uint32_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *crow = w->codes + (size_t)r * w->row_bytes;
        const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
        for (uint32_t t = 0; t < ntok; t++) y[t * ld_y + (r - row0)] = 0.0f;
        for (uint32_t g = 0; g < w->ngroups; g++) {
            const uint8_t *cg = crow + (size_t)g * G / 4;
            const float norm = fp16_to_f32(norms[g]);
            for (uint32_t b = 0; b < nb; b++) {
                uint64_t c;
                memcpy(&c, cg + 8 * b, sizeof c);
                masks32(c, &km[1][b], &km[2][b], &km[3][b]);
            }
            for (uint32_t t = 0; t < ntok; t++) {
                const float *xr = rows + t * ld;
                const int16_t *zg = (const int16_t *)(const void *)(xr + zoff) + (size_t)g * G;
                __m512i a1 = _mm512_setzero_si512(), a2 = a1, a3 = a1;
                for (uint32_t b = 0; b < nb; b++) {
                    const __m512i z = _mm512_loadu_si512((const void *)(zg + 32 * b));
                    a1 = _mm512_dpwssd_epi32(a1, _mm512_maskz_mov_epi16(km[1][b], z), ones);
                    a2 = _mm512_dpwssd_epi32(a2, _mm512_maskz_mov_epi16(km[2][b], z), ones);
                    a3 = _mm512_dpwssd_epi32(a3, _mm512_maskz_mov_epi16(km[3][b], z), ones);
                }
                int32_t s[4], q[15];
                hsum4(_mm512_setzero_si512(), a1, a2, a3, s);
                for (uint32_t p = 0; p < P.n; p++) q[p] = s[P.sel[p]];
                float *yt = y + t * ld_y + (r - row0);
                *yt = fmaf(norm, combine(&P, a8_row_sums_c(xr)[g], q), *yt);
            }
        }
        for (uint32_t t = 0; t < ntok; t++) {
            const float st = a8_row_scale(rows + t * ld) * rsg;
            y[t * ld_y + (r - row0)] *= st;
        }
    }
}

static const a8_kernels table = {
    .name = "avx512",
    .rotate = a8_rotate_natural,
    .matmul = vnni_matmul,
};

/* On top of AVX-512F and its OS state (cq_decode_avx512_supported): AVX-512BW and BMI2
 * (leaf 7 EBX bits 30 and 8) and AVX512-VNNI (leaf 7 ECX bit 11). */
static int probe_vnni(void) {
    if (!cq_decode_avx512_supported() || !a8_kernels_avx2()) return 0;
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 30 & 1) && (b >> 8 & 1) && (c >> 11 & 1);
}

const a8_kernels *a8_kernels_avx512(void) {
    static atomic_int supported = -1; /* racing threads all store the same value */
    int v = atomic_load_explicit(&supported, memory_order_relaxed);
    if (v < 0) {
        v = probe_vnni();
        atomic_store_explicit(&supported, v, memory_order_relaxed);
    }
    return v ? &table : NULL;
}

#else

const a8_kernels *a8_kernels_avx512(void) { return NULL; }

#endif
