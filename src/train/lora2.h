/* LoRA on the Needle 2 training core and the official 2.0.15 fine-tuning numerics
 * (cactus-needle 2.0.15 finetune.finetune_local, quantize.cq_ste_params), the Needle 2
 * twin of lora3.h with the same shape.
 *
 * The adapter's kernels (train_adapter: lora/<path>/A|B, `scale`) are merged into the base
 * as W + scale * A @ B; with `cq` every CQ leaf of the merged tree (_is_quant_leaf: the
 * kernels, the token and engram embeddings, mHC phi; kernels and phi grouped along their
 * input axis) is replaced by its CQ W4 dequantization (finetune_local's qat_bits "auto" for
 * a config without weight_bits; our quantizer, byte-exact with the official exporter) and
 * its gradient passes straight through. dA = scale * dW B^T, dB = scale * A^T dW. */
#ifndef NEEDLE_TRAIN_LORA2_H
#define NEEDLE_TRAIN_LORA2_H

#include "quant/cq_codebook.h"
#include "train/checkpoint.h"
#include "train/grad2.h"

/* qat_bits and CQ_GROUP_SIZE of the 2.0.15 fine-tuning loss */
#define G2_CQ_WEIGHT_BITS 4
#define G2_CQ_GROUP 128

/* Replaces every CQ leaf of m with its CQ dequantization (cb: group G2_CQ_GROUP). */
int g2_cq_weights(g2_model *m, const cq_codebooks *cb);

/* The loss of adapter `ad` over the base m (left as it was) and, into dA[i] / dB[i]
 * (numel of ad->lora[i].a / .b floats each), its gradient. cb NULL: float merged weights;
 * else CQ straight-through on them. Every adapter path must be a kernel of m with the
 * adapter's shapes. */
int g2_lora_loss(g2_model *m, const train_adapter *ad, const cq_codebooks *cb, const int32_t *ids,
                 const float *mask, uint32_t B, uint32_t T, double *loss, float **dA, float **dB);

/* A LoRA run over base m, the twin of g3_lora_prepare / step / finish (lora3.h): prepare
 * checks the adapter against m, keeps the adapted kernels' base values, replaces every other
 * CQ leaf by its CQ dequantization once (cb NULL: nothing to replace) and marks every tensor
 * but the adapted kernels frozen; each step merges W + scale A B into the adapted kernels,
 * quantizes those, runs the loss and writes dA / dB, bit for bit what g2_lora_loss gives on
 * the original base; finish puts the adapted kernels and the frozen flags back (the other
 * CQ leaves keep their CQ values). The adapter keeps its paths and shapes in between; A and
 * B may change. */
typedef struct g2_lora_prep g2_lora_prep;
int g2_lora_prepare(g2_model *m, const train_adapter *ad, const cq_codebooks *cb, g2_lora_prep **out);
int g2_lora_step(g2_lora_prep *p, const train_adapter *ad, const int32_t *ids, const float *mask, uint32_t B,
                 uint32_t T, double *loss, float **dA, float **dB);
void g2_lora_finish(g2_lora_prep *p); /* NULL is a no-op */

#endif
