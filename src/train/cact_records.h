/* Reading one .cact record into float the way the runtime reads it, for the training
 * core's .cact bases (cact_base.c, cact_base2.c, cact_base3.c). */
#ifndef NEEDLE_TRAIN_CACT_RECORDS_H
#define NEEDLE_TRAIN_CACT_RECORDS_H

#include <stdint.h>

#include "format/cact.h"

/* The `count` values of record `index` of a parsed file into dst, row-major over the
 * record's shape: CQ rows dequantized by cq_dequant_row (the runtime's reader), FP16 /
 * FP32 widened as the runtime widens them. transpose != 0: the record's [rows][cols] is
 * `lead` stacked blocks of [rows / lead][cols], each written transposed ([cols][rows /
 * lead]: a kernel stored [out][in], mHC phi stored [L*m][n*d]). A record whose size is not
 * `count` is refused (NEEDLE_ERR_FORMAT, naming it). */
/* Every value of record t of f as the runtime reads it, row-major over its shape, into out
 * (numel values: anything else is refused with NEEDLE_ERR_FORMAT naming the record). */
int cact_record_widen(const cact_file *f, const cact_tensor *t, float *out, uint64_t numel);

int cact_record_load(const cact_file *f, uint32_t index, float *dst, uint64_t count, int transpose, uint32_t lead);

#endif
