/* CQ ("Cactus Quants") matrices and the plain-C kernels over them (spec §1.6-1.8).
 *
 * A CQ row group is norm * H_G * codebook[idx]. Because H_G is symmetric, a dot product
 * with an activation group x_g equals norm * <codebook[idx], H_G x_g>: the activations
 * are rotated once (cq_rotate) and every row is then a codebook dot product in the
 * rotated domain. Weights are never expanded in memory. */
#ifndef NEEDLE_KERNELS_CQ_H
#define NEEDLE_KERNELS_CQ_H

#include <stddef.h>
#include <stdint.h>

typedef struct cq_matrix {
    uint32_t rows, cols;     /* logical [rows][cols] */
    uint32_t cols_pad;       /* cols rounded up to the group size */
    uint32_t group, ngroups; /* group size G, cols_pad / G */
    uint32_t bits;           /* 2, 3, 4, or 5 = ternary (stored as 2-bit crumbs) */
    uint32_t row_bytes;      /* packed index bytes per row */
    const uint8_t *codes;    /* [rows][row_bytes] LSB-first index stream */
    const uint16_t *norms;   /* [rows][ngroups] fp16 group norms */
    const float *codebook;   /* 16 levels, indexed by the stored code */
} cq_matrix;

/* In-place unnormalised fast Walsh-Hadamard transform in Sylvester order; n a power of 2. */
void fwht(float *x, uint32_t n);

/* xr[0:cols_pad] = per-group H_G · [x, 0...]; x has `cols` values; xr may equal x. */
void cq_rotate(const cq_matrix *w, const float *x, float *xr);

/* y[t][r - row0] = <W[r], x_t> for rows [row0, row0 + nrows) and tokens t < ntok, where
 * xr holds the rotated activations of token t at xr + t * ld_x (see cq_rotate) and the
 * result of token t goes to y + t * ld_y. */
void cq_matmul(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr, size_t ld_x,
               uint32_t ntok, float *y, size_t ld_y);

/* Unpacks the codes of row `r`, group `g` into G codebook values (unscaled by the norm). */
void cq_group_levels(const cq_matrix *w, uint32_t r, uint32_t g, float *out);

/* Dequantizes logical row `r` (cols values) the way the reference reader does. `tmp`
 * needs `group` floats. Used for embedding and engram-table lookups. */
void cq_dequant_row(const cq_matrix *w, uint32_t r, float *out, float *tmp);

#endif
