/* AVX2 W·A8 kernels (see a8.h): the plane sums of 2-bit (CQ2, ternary crumbs) and 4-bit
 * rows on 16 int16 lanes.
 *
 * For 16 columns, the code bytes are broadcast and shuffled so that 16-bit lane l holds
 * the byte with column l's code; AND with a per-lane bit selector and a compare give one
 * all-ones/zero mask per code bit, XORs of those give the parity planes, and vpmaddwd of
 * the int16 activations z with a plane mask adds (minus) the selected pairs into int32.
 * A row group's masks are built once and reused for every token of the batch. The sums
 * are exact, and the float combination is the plain kernel's fmaf sequence, so results
 * are bit-identical to the scalar level. 3-bit rows (codes straddle bytes) use the plain
 * group kernel; the activation rows are in natural order, the plain layout. */
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

/* Masks of code bit j (j < bits) for the 16 columns whose codes start at `p`. */
AVX2_INLINE void bit_masks(const uint8_t *p, uint32_t bits, __m256i m[4]) {
    __m256i v;
    if (bits == 2) {
        uint32_t w;
        memcpy(&w, p, 4);
        /* lanes 0-7: bytes 0,1 (columns 0-7); lanes 8-15: bytes 2,3 (columns 8-15) */
        const __m256i shuf = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                              2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
        v = _mm256_shuffle_epi8(_mm256_set1_epi32((int32_t)w), shuf);
        for (uint32_t j = 0; j < 2; j++) {
            /* lane l tests bit 2(l % 8) + j of its 16 bits */
            const __m256i sel = _mm256_setr_epi16(
                (short)(1 << j), (short)(1 << (2 + j)), (short)(1 << (4 + j)),
                (short)(1 << (6 + j)), (short)(1 << (8 + j)), (short)(1 << (10 + j)),
                (short)(1 << (12 + j)), (short)(1 << (14 + j)), (short)(1 << j),
                (short)(1 << (2 + j)), (short)(1 << (4 + j)), (short)(1 << (6 + j)),
                (short)(1 << (8 + j)), (short)(1 << (10 + j)), (short)(1 << (12 + j)),
                (short)(1 << (14 + j)));
            m[j] = _mm256_cmpeq_epi16(_mm256_and_si256(v, sel), sel);
        }
    } else {
        uint64_t w;
        memcpy(&w, p, 8);
        /* lane l: byte l / 2 in its low byte (the high byte is cleared by the selector) */
        const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                              4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
        v = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)w), shuf);
        for (uint32_t j = 0; j < 4; j++) {
            const short lo = (short)(1 << j), hi = (short)(1 << (4 + j));
            const __m256i sel = _mm256_setr_epi16(lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo,
                                                  hi, lo, hi, lo, hi);
            m[j] = _mm256_cmpeq_epi16(_mm256_and_si256(v, sel), sel);
        }
    }
}

static AVX2 void avx2_matmul(const cq_matrix *w, uint32_t row0, uint32_t nrows,
                             const float *rows, size_t ld, uint32_t ntok, float *y,
                             size_t ld_y) {
    const uint32_t bits = (w->bits == 2 || w->bits == 5) ? 2 : w->bits;
    const uint32_t G = w->group;
    if (bits == 3 || G % 16) {
        a8_matmul_natural(w, row0, nrows, rows, ld, ntok, y, ld_y);
        return;
    }
    a8_planes P;
    a8_planes_of(w, &P);
    const size_t zoff = a8_row_z_offset(w->cols_pad, G);
    const float rsg = 1.0f / sqrtf((float)G);
    const uint32_t nb = G / 16, block_bytes = 2 * bits;
    __m256i masks[15 * (A8_MAX_GROUP / 16)];
    for (uint32_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *crow = w->codes + (size_t)r * w->row_bytes;
        const uint16_t *norms = w->norms + (size_t)r * w->ngroups;
        for (uint32_t t = 0; t < ntok; t++) y[t * ld_y + (r - row0)] = 0.0f;
        for (uint32_t g = 0; g < w->ngroups; g++) {
            const uint8_t *cg = crow + (size_t)g * G * bits / 8;
            for (uint32_t b = 0; b < nb; b++) {
                __m256i m[4];
                bit_masks(cg + b * block_bytes, bits, m);
                for (uint32_t p = 0; p < P.n; p++) {
                    __m256i x = _mm256_setzero_si256();
                    for (uint32_t j = 0; j < bits; j++)
                        if (P.sel[p] >> j & 1) x = _mm256_xor_si256(x, m[j]);
                    masks[p * nb + b] = x;
                }
            }
            const float norm = fp16_to_f32(norms[g]);
            for (uint32_t t = 0; t < ntok; t++) {
                const float *xr = rows + t * ld;
                const int16_t *zg = (const int16_t *)(const void *)(xr + zoff) + (size_t)g * G;
                float d = P.cb0 * (float)a8_row_sums_c(xr)[g];
                for (uint32_t p = 0; p < P.n; p++) {
                    __m256i acc = _mm256_setzero_si256();
                    for (uint32_t b = 0; b < nb; b++) {
                        const __m256i z = _mm256_loadu_si256((const __m256i *)(zg + 16 * b));
                        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(z, masks[p * nb + b]));
                    }
                    /* the masks are -1: the sum comes out negated */
                    d = fmaf(P.coef[p], (float)-hsum_i32(acc), d);
                }
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

static const a8_kernels table = {
    .name = "avx2",
    .rotate = a8_rotate_natural,
    .matmul = avx2_matmul,
};

const a8_kernels *a8_kernels_avx2(void) { return cpu_kernels_avx2() ? &table : NULL; }

#else

const a8_kernels *a8_kernels_avx2(void) { return NULL; }

#endif
