/* W·A8: CQ products over 8-bit activations, the QAT numerics of spec §5.3, computed exactly.
 *
 * Quantization (per row, over the whole row): s = absmax/127 (1 if the row is zero),
 * q = clamp(round_half_even(x / s), -128, 127), in f32 like the reference. The model then
 * sees x~ = s·q, and a CQ product is
 *     <W_r, x~> = s/sqrt(G) · sum_g norm_g · D_g,   D_g = sum_k cb[idx_k] · z_k,
 * where z = H_G q is the unnormalised Walsh-Hadamard transform of the int8 group: an
 * integer vector (|z| <= 128·G, int16 for G <= 128).
 *
 * D_g on integers. Write the code book in the Walsh (parity) basis over the code bits:
 * cb[c] = sum_S f_S · (-1)^popcount(c & S). Then
 *     D_g = cb[0] · T_g + sum_{S != 0} a_S · Q_{S,g},   a_S = -2 f_S,
 * with T_g = sum_k z_k and Q_{S,g} = sum of the z_k whose code has odd parity on S: exact
 * integer sums. Only planes with f_S != 0 are kept (a8_planes_of): a symmetric book
 * (cb[~c] = -cb[c]) needs only the odd |S| (CQ2: b0, b1; ternary {0,c,0,-c}: b1, b0^b1);
 * the books in real files are slightly asymmetric, so CQ2 takes b0, b1 and b0^b1, and
 * CQ4 all 15 planes. The kernels get the plane sums either from bit masks (2 bits,
 * SIMD) or from the 2^bits per-code sums and their Walsh transform W_S = T - 2 Q_S (3 and
 * 4 bits): the same integers either way. The float work per group is one multiply-add
 * per plane, independent of the group size.
 *
 * Rounding. The integer sums are exact in any order; the float combination is the same
 * sequence of correctly rounded fmaf() calls in every kernel, group by group:
 *     d = cb[0]·T; d = fmaf(a_S, Q_S, d) over the planes in increasing S;
 *     acc = fmaf(norm_g, d, acc) over the groups; y = acc · (s · (1/sqrt(G))).
 * So every kernel level gives bit-identical results, and so does every thread count.
 *
 * Row layout. A quantized activation row lives in the float buffer the float path would
 * hold its rotated row in ([ntok][ld] floats, ld >= cols_pad): float 0 holds s, floats
 * 8.. hold T_g as int32 (ngroups, padded to 8), then int16 z[cols_pad] in the order the
 * kernel level's own a8_rotate writes (a8_matmul of the same level reads it). */
#ifndef NEEDLE_KERNELS_CPU_A8_H
#define NEEDLE_KERNELS_CPU_A8_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cq.h"

/* The largest CQ group an A8 product handles (z must fit int16). */
#define A8_MAX_GROUP 128u
/* The widest input an A8 row is made for (the quantized row is staged on the stack). */
#define A8_MAX_COLS 4096u

/* Floats an A8 row of a matrix with these dimensions needs. */
static inline size_t a8_row_floats(uint32_t cols_pad, uint32_t group) {
    const size_t ngroups = cols_pad / group;
    return 8 + (ngroups + 7) / 8 * 8 + ((size_t)cols_pad + 1) / 2;
}

static inline float a8_row_scale(const float *row) { return row[0]; }
static inline int32_t *a8_row_sums(float *row) { return (int32_t *)(void *)(row + 8); }
static inline const int32_t *a8_row_sums_c(const float *row) {
    return (const int32_t *)(const void *)(row + 8);
}
static inline size_t a8_row_z_offset(uint32_t cols_pad, uint32_t group) {
    return 8 + ((size_t)cols_pad / group + 7) / 8 * 8; /* in floats */
}

/* Whether A8 products over `w` are possible (group size, row fits in `cols_pad` floats). */
int a8_supported(const cq_matrix *w);

/* The code book of `w` in the plane form above. */
typedef struct a8_planes {
    uint32_t n;        /* planes used */
    uint8_t sel[15];   /* the bit subset S of each plane */
    float coef[15];    /* a_S */
    float cb0;         /* cb[0] */
    uint32_t bits;     /* code bits: 2 (CQ2, ternary crumbs), 3 or 4 */
} a8_planes;

void a8_planes_of(const cq_matrix *w, a8_planes *out);

/* One kernel level's A8 functions. */
typedef struct a8_kernels {
    const char *name; /* "scalar", "avx2", "avx512", "neon" */
    /* Quantizes x (w->cols floats) and writes the A8 row of it for products with w (and
     * every matrix of the same cols_pad and group). `row` may alias x. */
    void (*rotate)(const cq_matrix *w, const float *x, float *row);
    /* y[t][r - row0] = <W[r], x~_t> for rows [row0, row0 + nrows), over A8 rows at
     * rows + t * ld (written by this level's rotate). */
    void (*matmul)(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *rows,
                   size_t ld, uint32_t ntok, float *y, size_t ld_y);
} a8_kernels;

extern const a8_kernels a8_kernels_scalar;
const a8_kernels *a8_kernels_avx2(void); /* NULL without AVX2 (build or CPU) */
/* 2- and 4-bit codes on AVX-512BW + VNNI + BMI2 (a8_avx512.c),
 * the rest through the AVX2 kernel; NULL without those (build or CPU). */
const a8_kernels *a8_kernels_avx512(void);
const a8_kernels *a8_kernels_neon(void); /* NULL where the NEON level does not run */

/* The level called `name`, or NULL if unknown or unsupported here. A session takes the
 * level of its float kernel table (so NEEDLE_CPU lowers both alike). */
const a8_kernels *a8_kernels_named(const char *name);

/* The portable group kernel shared by every level for what it does not vectorize:
 * rows [row0, row0 + nrows) over natural-order z. */
void a8_matmul_natural(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *rows,
                       size_t ld, uint32_t ntok, float *y, size_t ld_y);

/* The portable rotate: the A8 row in natural column order. */
void a8_rotate_natural(const cq_matrix *w, const float *x, float *row);

/* The codes of columns [k0, k0 + n) of a packed row (n a multiple of 8), one per byte. */
void a8_unpack_codes(const cq_matrix *w, const uint8_t *row, uint32_t k0, uint32_t n,
                     uint8_t *codes);

/* Quantizes x into q (cols_pad values, zero padded) and returns the scale s. */
float a8_quantize(const float *x, uint32_t cols, uint32_t cols_pad, int16_t *q);

/* Runs every job over the same A8 rows, sharing rows among the pool's threads (each row
 * is computed whole by one thread, so results do not depend on the thread count). */
void a8_matmul_pool(cpu_pool *pool, const a8_kernels *k, const float *rows, size_t ld,
                    uint32_t ntok, const cq_job *jobs, uint32_t njobs);

#endif
