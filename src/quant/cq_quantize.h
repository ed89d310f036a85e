/* CQ quantization of a float matrix into a .cact CQ blob (spec §1.6, §2.3), rounding
 * exactly as the official exporter (cactus-needle 2.0.15 export._cq_pack) does on x86-64.
 *
 * The exporter rotates each group with a float32 matrix product `g @ H` that numpy hands
 * to OpenBLAS, so the rotation's rounding is that of the BLAS kernel, not of a fast
 * Walsh-Hadamard transform:
 *   - a row with two or more groups goes through sgemm: every output is one fused
 *     multiply-add chain over k = 0..G-1, starting from 0;
 *   - a row with one group goes through sgemv: the chain restarts every 8 k's and the
 *     8-term partial sums are added (unfused) in order.
 * Both were measured against numpy 2.4.6 / OpenBLAS 0.3.31 (AVX-512 and AVX2 kernels use
 * the same order). The group norm is numpy's float32 pairwise sum of squares. */
#ifndef NEEDLE_QUANT_CQ_QUANTIZE_H
#define NEEDLE_QUANT_CQ_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

#include "quant/cq_codebook.h"

/* Blob size of a [rows][cols] matrix at record width `bits` (2, 3, 4, CQ_TERNARY), or 0
 * when the size does not fit in 64 bits. */
uint64_t cq_blob_bytes(uint64_t rows, uint64_t cols, uint32_t bits, uint32_t group);

/* Quantizes w[rows][cols] (row-major, finite) into blob (cq_blob_bytes bytes): packed
 * indices then f16 norms. Returns 0, or NEEDLE_ERR_INVALID_ARGUMENT with a message when
 * a value is not finite or a group norm does not fit in f16. If `sq_err` is not NULL it
 * receives the sum of squared differences between w and the blob's dequantized values,
 * and `sq_ref` the sum of squares of w (both in double). */
int cq_quantize_matrix(const cq_codebooks *cb, const float *w, uint32_t rows, uint32_t cols, uint32_t bits,
                       uint8_t *blob, double *sq_err, double *sq_ref);

/* Dequantizes a CQ blob back to w[rows][cols] the way the official reader does
 * (export._cq_unpack: (codebook[idx] * norm) @ H with the same BLAS rounding). The blob
 * must be valid for the shape (cact_parse checked). Returns 0 or NEEDLE_ERR_OUT_OF_MEMORY. */
int cq_dequantize_matrix(const cq_codebooks *cb, const uint8_t *blob, uint32_t rows, uint32_t cols,
                         uint32_t bits, float *w);

#endif
