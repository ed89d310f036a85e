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

/* A LoRA run over base m: what does not change from step to step done once.
 * g3_lora_prepare checks the adapter's paths and shapes against m, keeps a copy of the
 * adapted kernels' base values, replaces every other CQ leaf of m by its CQ dequantization
 * once (cb NULL: float weights, nothing to replace; the 70M engram table values are most
 * of it) and marks every tensor but the adapted kernels frozen. Each g3_lora_step then
 * merges W + scale A B into the adapted kernels only, quantizes those (they change with
 * every update), runs the loss and writes dA / dB, with no allocation of its own after the
 * first call. Its loss and gradients are bit for bit those of g3_lora_loss on the original
 * base. g3_lora_finish puts the adapted kernels' base values and the frozen flags back; the
 * other CQ leaves keep their CQ values (the frozen base of the fine-tuning loss). The
 * adapter must keep its paths and shapes between prepare and finish; A and B may change. */
typedef struct g3_lora_prep g3_lora_prep;
int g3_lora_prepare(g3_model *m, const train_adapter *ad, const cq_codebooks *cb, g3_lora_prep **out);
int g3_lora_step(g3_lora_prep *p, const train_adapter *ad, const int32_t *ids, const float *mask, uint32_t B,
                 uint32_t T, double *loss, float **dA, float **dB);
void g3_lora_finish(g3_lora_prep *p); /* NULL is a no-op */

#endif
