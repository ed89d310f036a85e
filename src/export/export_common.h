/* What the Needle 2 and Needle 3 exporters share: fetching checkpoint tensors with exact
 * shapes, and appending FP16 / CQ records (quantized with the official rounding) to a
 * writer while reporting progress. Internal to src/export. */
#ifndef NEEDLE_EXPORT_EXPORT_COMMON_H
#define NEEDLE_EXPORT_EXPORT_COMMON_H

#include <stdint.h>

#include "export/cact_write.h"
#include "export/export_model.h"
#include "export/safetensors.h"
#include "quant/cq_codebook.h"

typedef struct export_ctx {
    const st_file *ck;
    const cq_codebooks *cb;
    const export_options *opt;
    cact_writer *w;
    uint32_t count; /* records the file will have, for progress */
} export_ctx;

/* The checkpoint tensor `name` with exactly this shape, or NULL with a message. */
const st_tensor *ex_need(const export_ctx *x, const char *name, uint32_t ndim,
                         const uint64_t *shape);

/* Calls the progress callback for the record just added. */
void ex_report(export_ctx *x, double rel);

/* Quantizes mat[rows][cols] (malloc'd, freed here) into a CQ record; the width is the bits
 * map's for `label`, or `bits` when it is not 0. */
int ex_add_cq(export_ctx *x, const char *label, float *mat, uint64_t rows, uint64_t cols);
int ex_add_cq_bits(export_ctx *x, const char *label, float *mat, uint64_t rows, uint64_t cols,
                   uint32_t bits);

/* FP16 records: from values (NULL: zeros), or from t's elements starting at `first`. */
int ex_add_fp16_values(export_ctx *x, const char *label, const float *values, uint8_t ndim,
                       const uint32_t *shape);
int ex_add_fp16(export_ctx *x, const char *label, const st_tensor *t, uint64_t first, uint8_t ndim,
                const uint32_t *shape);

/* A float matrix of rows x cols (malloc'd), or NULL with a message. */
float *ex_alloc_mat(const char *label, uint64_t rows, uint64_t cols);

/* t[first .. first + rows*cols) as a CQ record; a flax kernel slice [in][out] stored
 * transposed [out][in]. */
int ex_add_cq_direct(export_ctx *x, const char *label, const st_tensor *t, uint64_t first,
                     uint64_t rows, uint64_t cols);
int ex_add_cq_direct_bits(export_ctx *x, const char *label, const st_tensor *t, uint64_t first,
                          uint64_t rows, uint64_t cols, uint32_t bits);
int ex_add_cq_kernel(export_ctx *x, const char *label, const st_tensor *t, uint64_t first,
                     uint64_t in, uint64_t out);

/* The engram module's convolution taps (fixed in both generations' code). */
#define ENGRAM_CONV_TAPS 4u

/* The mHC records of an L-layer stack with n lanes of width d: the six per-layer scalars
 * and vectors, then the three phi matrices transposed to [L*lanes][n*d]. */
int ex_add_mhc_records(export_ctx *x, uint64_t L, uint64_t n, uint64_t d);

/* The four records of engram site `site`: the hashed tables [T*slots][sub], the key and
 * value projections, the conv taps. */
int ex_add_engram_site(export_ctx *x, uint32_t site, uint64_t T, uint64_t slots, uint64_t sub,
                       uint64_t d);

/* 1 if some tensor is named "<key>/..." */
int ex_has_prefix_tensor(const st_file *f, const char *key);

#endif
