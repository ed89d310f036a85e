/* LoRA on the Needle 3 training core and the official fine-tuning numerics
 * (cactus-needle 3.2.8 finetune.finetune_local / _loss, quantize.cq_ste_params).
 *
 * The adapter's kernels (train_adapter, official write_adapter layout) are merged into the
 * base as W + scale * A @ B; with `cq` every CQ leaf of the merged tree (kernels, the
 * token and engram embeddings, mHC phi; kernels and phi grouped along their input axis) is
 * replaced by its CQ W4 dequantization (our quantizer, byte-exact with the official
 * exporter) and its gradient passes straight through. The gradients of A and B follow:
 * dA = scale * dW B^T, dB = scale * A^T dW. */
#ifndef NEEDLE_TRAIN_LORA3_H
#define NEEDLE_TRAIN_LORA3_H

#include "quant/cq_codebook.h"
#include "train/checkpoint.h"
#include "train/grad3.h"

/* The official WEIGHT_BITS and CQ_GROUP_SIZE of the fine-tuning loss */
#define G3_CQ_WEIGHT_BITS 4
#define G3_CQ_GROUP 128

/* Replaces every CQ leaf of m with its CQ dequantization (cb: group G3_CQ_GROUP). */
int g3_cq_weights(g3_model *m, const cq_codebooks *cb);

/* The loss of adapter `ad` over the base m (left as it was) and, into dA[i] / dB[i]
 * (numel of ad->lora[i].a / .b floats each), its gradient. cb NULL: float merged weights;
 * else CQ straight-through on them. Every adapter path must be a kernel of m with the
 * adapter's shapes. */
int g3_lora_loss(g3_model *m, const train_adapter *ad, const cq_codebooks *cb, const int32_t *ids,
                 const float *mask, uint32_t B, uint32_t T, double *loss, float **dA, float **dB);

#endif
