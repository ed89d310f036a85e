/* One-token ("decode") CQ products on AVX-512F (kernels/cpu/cq_decode_avx512.c).
 *
 * These are building blocks for an "avx512" kernel level, not a level of their own: the
 * level's matmul calls cq_decode_avx512() when ntok == 1 and uses its own or the AVX2
 * code otherwise. They take every bit width and any group that is a multiple of 16. */
#ifndef NEEDLE_KERNELS_CPU_CQ_DECODE_AVX512_H
#define NEEDLE_KERNELS_CPU_CQ_DECODE_AVX512_H

#include <stdint.h>

#include "kernels/cpu/cpu.h"

/* 1 if this build and this CPU (and the OS, which must save the ZMM state) can run
 * cq_decode_avx512(): AVX-512F, AVX2, FMA and F16C. Thread-safe; probes once. */
int cq_decode_avx512_supported(void);

/* y[i] = <W[row0 + i], xr> for i < nrows, one token (see cq_matmul(); xr holds cols_pad
 * rotated activations in column order, any alignment). With a scratch of at least
 * cols_pad + 16 floats (cq_scratch_floats(cols_pad, 1) is enough) the 2- and 4-bit
 * products re-lay out xr into it once (cached as cq_scratch describes) and run faster;
 * NULL or a smaller one takes the column-order path. Returns 1 when done, 0 when it
 * does not take this matrix (group not a multiple of 16, or no AVX-512 in this build),
 * leaving y alone, so the caller falls back to another kernel. Call only after
 * cq_decode_avx512_supported() returned 1. A row's value depends only on the row, the
 * activations and whether the scratch was large enough, never on row0/nrows or on which
 * thread computes it. */
int cq_decode_avx512(const cq_matrix *w, uint32_t row0, uint32_t nrows, const float *xr,
                     float *y, cq_scratch *scratch);

/* Row r of w decoded as level x group norm, in column order (cols_pad floats; the AMX
 * level's weight panels). Returns 1, or 0 (out untouched) for a group that is not a
 * multiple of 16 or no AVX-512 in this build. Call only after
 * cq_decode_avx512_supported() returned 1. */
int cq_decode_avx512_row(const cq_matrix *w, uint32_t r, float *out);

#endif
