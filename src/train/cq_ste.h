/* CQ fake quantization of training weights (the forward of the official cq_ste_params):
 * every group replaced by its CQ dequantization, exactly what cq_quantize_matrix then
 * cq_dequantize_matrix (quant/cq_quantize.c, byte-exact with the official exporter) give,
 * but for many groups at once: the two Hadamard rotations of all groups of a chunk run as
 * one product (train/tgemm.h) whose arithmetic is the quantizer's own fmaf chain (k in
 * order; for a single group per line, chains of 8 added in turn), and the rest (norm as
 * numpy's pairwise sum, nearest level with ties low, fp16 norm) per group on the model's
 * threads. The quantizer rotates one group at a time with a call per multiply-add, which
 * cost ~15 s per training step for the adapted kernels alone. */
#ifndef NEEDLE_TRAIN_CQ_STE_H
#define NEEDLE_TRAIN_CQ_STE_H

#include <stdint.h>

#include "quant/cq_codebook.h"
#include "train/grad3.h"

/* `lines` lines of `cols` values, value (r, c) at w[r * line_stride + c * col_stride],
 * each cut into groups of cb->group along c (the last one zero-padded), replaced in place
 * by their CQ dequantization at `bits`. NEEDLE_ERR_INVALID_ARGUMENT (with the line and
 * column) for a value that is not finite or a group norm beyond float16. */
/* The same for either core: `run` shares fn(arg, i, n) among the threads of `core`
 * (g3_run_parallel or g2_run_parallel behind a cast of the core to const void *). */
typedef void (*train_run_fn)(const void *core, void (*fn)(void *arg, int i, int n), void *arg);
int train_cq_fake_quant(train_run_fn run, const void *core, const cq_codebooks *cb, uint32_t bits, float *w,
                        uint64_t lines, uint32_t cols, uint64_t line_stride, uint64_t col_stride);

int g3_cq_fake_quant(const g3_model *m, const cq_codebooks *cb, uint32_t bits, float *w, uint64_t lines,
                     uint32_t cols, uint64_t line_stride, uint64_t col_stride);

#endif
