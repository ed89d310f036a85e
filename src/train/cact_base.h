/* A Needle 3 .cact as a training base: every record dequantized back to the official
 * checkpoint tensor it was exported from (the inverse of export3_build's naming and
 * layouts: kernels stored [out][in] transposed back to flax's [in][out], the mHC phi
 * matrices back to [L, n*d, lanes], per-layer records stacked into [L, ...]), every
 * record read as the runtime reads it (cact_records.h: CQ rows by cq_dequant_row with the
 * file's codebooks, FP16 widened exactly), so the base trained on is the network the
 * engine runs; and the TransformerConfig rebuilt from the header. The probe heads come back too (so a build from it keeps them).
 *
 * Refused with a message: a Needle 2 file, a ladder file (its Hadamard permutations
 * split in halves: the training core runs no ladder), a rung whose layers are not all in
 * the file, a record with an unexpected shape. */
#ifndef NEEDLE_TRAIN_CACT_BASE_H
#define NEEDLE_TRAIN_CACT_BASE_H

#include "format/cact.h"
#include "train/checkpoint.h"

/* out: generation 3, format_version 2, the config JSON, the tensors (F32, owned). */
int train_checkpoint_from_cact(const cact_file *f, train_checkpoint *out);

#endif
