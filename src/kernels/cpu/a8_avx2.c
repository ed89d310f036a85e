/* AVX2 W·A8 kernels (see a8.h).
 *
 * 2 bits (CQ2, ternary crumbs): plane sums on 16 int16 lanes. For 16 columns the 4 code
 * bytes are broadcast and shuffled so that 16-bit lane l holds the bits of column l; AND
 * with a per-lane selector and a compare give an all-ones/zero mask per code bit, their
 * XOR the third plane (a general 4-level book needs b0, b1 and b0^b1), and vpmaddwd of the
 * int16 activations with a mask adds (minus) the selected pairs into int32. One token
 * accumulates straight from the masks; several take 4 tokens per mask build.
 * 3 and 4 bits: per-code sums and their Walsh transform (the plain kernel's method, with
 * fmaf inlined); 8 or 15 plane masks would cost more.
 * The sums are exact and the float combination is the plain kernel's fmaf sequence, so
 * results are bit-identical to the scalar level. Activation rows are in natural order
 * (the plain rotate). */
#include <math.h>
#include <string.h>

#include "kernels/cpu/a8.h"
#include "util/fp16.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma")))

AVX2_INLINE int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* Per-lane bit selectors: lane l tests bit 2(l % 8) + j of its 16 bits. */
#define SEL2(j)                                                                              \
    {1 << (j), 1 << (2 + (j)), 1 << (4 + (j)), 1 << (6 + (j)), 1 << (8 + (j)), 1 << (10 + (j)), \
     1 << (12 + (j)), 1 << (14 + (j)), 1 << (j), 1 << (2 + (j)), 1 << (4 + (j)),               \
     1 << (6 + (j)), 1 << (8 + (j)), 1 << (10 + (j)), 1 << (12 + (j)), 1 << (14 + (j))}
static const uint16_t sel2[2][16] __attribute__((aligned(32))) = {SEL2(0), SEL2(1)};

/* Masks of the two code bits of the 16 2-bit columns whose codes start at p. */
AVX2_INLINE void masks2(const uint8_t *p, __m256i *m0, __m256i *m1) {
    int32_t w;
    memcpy(&w, p, 4);
    /* lanes 0-7: bytes 0,1 (columns 0-7); lanes 8-15: bytes 2,3 (columns 8-15) */
    const __m256i shuf = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3,
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(w), shuf);
    const __m256i s0 = _mm256_load_si256((const __m256i *)sel2[0]);
    const __m256i s1 = _mm256_load_si256((const __m256i *)sel2[1]);
    *m0 = _mm256_cmpeq_epi16(_mm256_and_si256(v, s0), s0);
    *m1 = _mm256_cmpeq_epi16(_mm256_and_si256(v, s1), s1);
}

/* The float combination of a8.h for one group of one token; q[p] are the plane sums. */
static inline float combine(const a8_planes *P, int32_t T, const int32_t *q) {
    float d = P->cb0 * (float)T;
    for (uint32_t p = 0; p < P->n; p++) d = fmaf(P->coef[p], (float)q[p], d);
    return d;
}

/* 3 and 4 bits: 8 or 15 planes cost more in vectors than per-code sums (four tables, so
 * no store-load chains) and their Walsh transform, which gives every plane sum at once:
 * W_S = T - 2 Q_S. The plain kernel's arithmetic, here with fmaf inlined. */
static AVX2 void percode_matmul(const cq_matrix *w, uint32_t row0, uint32_t nrows,
                                const float *rows, size_t ld, uint32_t ntok, float *y,
                                size_t ld_y) {
    a8_planes P;
    a8_planes_of(w, &P);
    const uint32_t G = w->group, levels = 1u << P.bits;
    const size_t zoff = a8_row_z_offset(w->cols_pad, G);
    const float rsg = 1.0f / sqrtf((float)G);
    uint8_t codes[A8_MAX_GROUP];
    for (uint32_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *crow = w->codes + (size_t)r * w->row_bytes;
        const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
        for (uint32_t t = 0; t < ntok; t++) y[t * ld_y + (r - row0)] = 0.0f;
        for (uint32_t g = 0; g < w->ngroups; g++) {
            a8_unpack_codes(w, crow, g * G, G, codes);
            const float norm = fp16_to_f32(norms[g]);
            for (uint32_t t = 0; t < ntok; t++) {
                const float *xr = rows + t * ld;
                const int16_t *zg = (const int16_t *)(const void *)(xr + zoff) + (size_t)g * G;
                const int32_t T = a8_row_sums_c(xr)[g];
                int32_t W4[4][16] = {{0}}, W[16];
                for (uint32_t k = 0; k < G; k += 4)
                    for (uint32_t i = 0; i < 4; i++) W4[i][codes[k + i]] += zg[k + i];
                for (uint32_t c = 0; c < 16; c++) W[c] = W4[0][c] + W4[1][c] + W4[2][c] + W4[3][c];
                for (uint32_t h = 1; h < levels; h <<= 1)
                    for (uint32_t i = 0; i < levels; i += 2 * h)
                        for (uint32_t j = i; j < i + h; j++) {
                            const int32_t a = W[j], b = W[j + h];
                            W[j] = a + b;
                            W[j + h] = a - b;
                        }
                float d = P.cb0 * (float)T;
                for (uint32_t p = 0; p < P.n; p++)
                    d = fmaf(P.coef[p], (float)((T - W[P.sel[p]]) / 2), d);
                float *yt = y + t * ld_y + (r - row0);
                *yt = fmaf(norm, d, *yt);
            }
        }
        for (uint32_t t = 0; t < ntok; t++) {
            const float st = a8_row_scale(rows + t * ld) * rsg;
            y[t * ld_y + (r - row0)] *= st;
        }
    }
}

static AVX2 void avx2_matmul(const cq_matrix *w, uint32_t row0, uint32_t nrows,
                             const float *rows, size_t ld, uint32_t ntok, float *y,
                             size_t ld_y) {
    const uint32_t G = w->group;
    if (G % 16) {
        a8_matmul_natural(w, row0, nrows, rows, ld, ntok, y, ld_y);
        return;
    }
    if (w->bits != 2 && w->bits != 5) {
        percode_matmul(w, row0, nrows, rows, ld, ntok, y, ld_y);
        return;
    }
    a8_planes P;
    a8_planes_of(w, &P);
    const size_t zoff = a8_row_z_offset(w->cols_pad, G);
    const float rsg = 1.0f / sqrtf((float)G);
    const uint32_t nb = G / 16, np = P.n;
    __m256i masks[3 * (A8_MAX_GROUP / 16)];
    for (uint32_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *crow = w->codes + (size_t)r * w->row_bytes;
        const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
        for (uint32_t t = 0; t < ntok; t++) y[t * ld_y + (r - row0)] = 0.0f;
        for (uint32_t g = 0; g < w->ngroups; g++) {
            const uint8_t *cg = crow + (size_t)g * G / 4;
            const float norm = fp16_to_f32(norms[g]);
            int32_t q[15];
            if (ntok == 1) {
                /* one token: the three possible planes straight from the masks */
                const int16_t *zg = (const int16_t *)(const void *)(rows + zoff) + (size_t)g * G;
                __m256i a[4];
                a[1] = a[2] = a[3] = _mm256_setzero_si256();
                for (uint32_t b = 0; b < nb; b++) {
                    __m256i m0, m1;
                    masks2(cg + b * 4, &m0, &m1);
                    const __m256i z = _mm256_loadu_si256((const __m256i *)(zg + 16 * b));
                    a[1] = _mm256_add_epi32(a[1], _mm256_madd_epi16(z, m0));
                    a[2] = _mm256_add_epi32(a[2], _mm256_madd_epi16(z, m1));
                    a[3] = _mm256_add_epi32(a[3], _mm256_madd_epi16(z, _mm256_xor_si256(m0, m1)));
                }
                /* the masks are -1: the sums come out negated */
                for (uint32_t p = 0; p < np; p++) q[p] = -hsum_i32(a[P.sel[p]]);
                y[r - row0] = fmaf(norm, combine(&P, a8_row_sums_c(rows)[g], q), y[r - row0]);
                continue;
            }
            /* 4 tokens at a time: each block's masks serve all four */
            uint32_t t0 = 0;
            for (; t0 + 4 <= ntok; t0 += 4) {
                const int16_t *z[4];
                for (int i = 0; i < 4; i++)
                    z[i] = (const int16_t *)(const void *)(rows + (t0 + i) * ld + zoff) +
                           (size_t)g * G;
                __m256i a[4][4];
                for (int i = 0; i < 4; i++) a[i][1] = a[i][2] = a[i][3] = _mm256_setzero_si256();
                for (uint32_t b = 0; b < nb; b++) {
                    __m256i m0, m1;
                    masks2(cg + b * 4, &m0, &m1);
                    const __m256i m01 = _mm256_xor_si256(m0, m1);
                    for (int i = 0; i < 4; i++) {
                        const __m256i zz = _mm256_loadu_si256((const __m256i *)(z[i] + 16 * b));
                        a[i][1] = _mm256_add_epi32(a[i][1], _mm256_madd_epi16(zz, m0));
                        a[i][2] = _mm256_add_epi32(a[i][2], _mm256_madd_epi16(zz, m1));
                        a[i][3] = _mm256_add_epi32(a[i][3], _mm256_madd_epi16(zz, m01));
                    }
                }
                for (int i = 0; i < 4; i++) {
                    for (uint32_t p = 0; p < np; p++) q[p] = -hsum_i32(a[i][P.sel[p]]);
                    const float *xr = rows + (t0 + i) * ld;
                    float *yt = y + (t0 + i) * ld_y + (r - row0);
                    *yt = fmaf(norm, combine(&P, a8_row_sums_c(xr)[g], q), *yt);
                }
            }
            if (t0 == ntok) continue;
            for (uint32_t b = 0; b < nb; b++) {
                __m256i par[4];
                masks2(cg + b * 4, &par[1], &par[2]);
                par[3] = _mm256_xor_si256(par[1], par[2]);
                for (uint32_t p = 0; p < np; p++) masks[p * nb + b] = par[P.sel[p]];
            }
            for (uint32_t t = t0; t < ntok; t++) {
                const float *xr = rows + t * ld;
                const int16_t *zg = (const int16_t *)(const void *)(xr + zoff) + (size_t)g * G;
                for (uint32_t p = 0; p < np; p++) {
                    __m256i acc = _mm256_setzero_si256();
                    for (uint32_t b = 0; b < nb; b++) {
                        const __m256i z = _mm256_loadu_si256((const __m256i *)(zg + 16 * b));
                        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(z, masks[p * nb + b]));
                    }
                    q[p] = -hsum_i32(acc);
                }
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
    .name = "avx2",
    .rotate = a8_rotate_natural,
    .matmul = avx2_matmul,
};

const a8_kernels *a8_kernels_avx2(void) { return cpu_kernels_avx2() ? &table : NULL; }

#else

const a8_kernels *a8_kernels_avx2(void) { return NULL; }

#endif
