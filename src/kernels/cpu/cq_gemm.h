/* Many-token CQ products on x86 (the prefill path of the AVX2 and AVX-512 levels).
 *
 * cq_avx2.c owns the weight decoding and the activation layout (see there); the products
 * live in cq_gemm_avx2.c and cq_gemm_avx512.c. A product decodes a panel of rows once,
 * norms folded in, into the caller's scratch and multiplies it against every token in
 * register tiles.
 *
 * Arithmetic of the AVX2 products: every (row, token) pair has one 8-lane accumulator
 * over the columns in layout order, summed across lanes by the same reduction whichever
 * tile computes it; so a value depends only on the row and the token, never on the tile
 * shape, the rows that share a call or the thread that runs it. */
#ifndef NEEDLE_KERNELS_CPU_CQ_GEMM_H
#define NEEDLE_KERNELS_CPU_CQ_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu.h"

/* Rows [r, r + n) of w decoded to level x norm floats in layout `layout` (cq_avx2.c),
 * row i at out + i * cols_pad; out 32-byte aligned. AVX2 code: call only where
 * cpu_kernels_avx2() is non-NULL. */
void cq_avx2_decode_rows(const cq_matrix *w, int layout, uint32_t r, uint32_t n, float *out);

/* y[t][r - row0] = <W[r], x_t> for rows [row0, row0 + nrows) and tokens t < ntok (ntok >=
 * 2), xp the activations permuted into `layout` ([ntok][cols_pad], 32-byte aligned) and
 * wbuf room for `wrows` >= 2 decoded rows (32-byte aligned). */
typedef void (*cq_gemm_fn)(const cq_matrix *w, int layout, uint32_t row0, uint32_t nrows,
                           const float *xp, uint32_t ntok, float *y, size_t ld_y, float *wbuf,
                           uint32_t wrows);

void cq_gemm_avx2(const cq_matrix *w, int layout, uint32_t row0, uint32_t nrows,
                  const float *xp, uint32_t ntok, float *y, size_t ld_y, float *wbuf,
                  uint32_t wrows);

/* The AVX-512 level's product (cq_gemm_avx512.c), also the AMX level's where the tile
 * unit does not suit a matrix. */
void cq_gemm_avx512(const cq_matrix *w, int layout, uint32_t row0, uint32_t nrows,
                    const float *xp, uint32_t ntok, float *y, size_t ld_y, float *wbuf,
                    uint32_t wrows);

/* The AVX2 matmul (see cpu_kernels.matmul) with its many-token products done by `gemm`. */
void cq_avx2_matmul_with(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr,
                         size_t ld_x, uint32_t ntok, float *y, size_t ld_y, cq_scratch *sc,
                         cq_gemm_fn gemm);

#endif
