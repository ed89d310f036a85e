/* What `needle build` does to an official Needle 3 checkpoint before the exporter sees it
 * (cactus-needle 3.2.8, model/build.py and model/finetune.merge_lora):
 *
 *   - the checkpoint's metadata: format_version 2 and the TransformerConfig as JSON,
 *     normalized as TransformerConfig.from_saved does (unknown keys dropped, the newer
 *     keys defaulted to "off");
 *   - an official LoRA adapter (read by train/checkpoint.h);
 *   - the merge W += scale * A @ B for every adapted kernel, in float32 then cast to the
 *     kernel's stored dtype, as jax computes it on the CPU: each product element is a
 *     chain of fused multiply-adds over the rank whose split into accumulators follows
 *     XLA's CPU dot kernel for that output width (see lora_matmul), so the merged
 *     weights are the official ones bit for bit;
 *   - the view the exporter reads: mtp_* heads dropped (run.load_checkpoint), the
 *     confidence head dropped when an adapter was merged (build.build_main), and from a
 *     checkpoint of `needle finetune --full` (trunk trained, head not: ours, no official
 *     counterpart). */
#ifndef NEEDLE_TRAIN_LORA_MERGE_H
#define NEEDLE_TRAIN_LORA_MERGE_H

#include <stddef.h>
#include <stdint.h>

#include "export/safetensors.h"
#include "train/checkpoint.h"

/* The checkpoint's config as from_saved sees it (malloc'd JSON text), after checking
 * format_version (train/checkpoint.h: TRAIN_CHECKPOINT_FORMAT) and refusing Needle 2
 * checkpoints. `path` is for messages. */
int lora_checkpoint_config(const st_file *ck, const char *path, char **config_json);

/* out[lead][in][out] = a[lead][in][rank] @ b[lead][rank][out] in float32 with XLA's CPU
 * summation order. */
void lora_matmul(const float *a, const float *b, uint64_t lead, uint64_t in, uint64_t rank, uint64_t outd,
                 float *out);

/* The checkpoint as the exporter reads it after the build's changes: a view whose
 * tensors point into the checkpoint image, except the merged ones (owned here). */
typedef struct lora_view {
    st_file st;
    uint8_t **owned;
    uint32_t n_owned;
} lora_view;

/* Builds the view of `ck`: mtp_* dropped; with an adapter (may be NULL), every group
 * merged and the confidence head dropped, as it is from a `needle finetune --full`
 * checkpoint unless `needle calibrate` trained the head after the trunk
 * (*dropped_confidence set when there was one). */
int lora_view_build(const st_file *ck, const train_adapter *ad, lora_view *out, int *dropped_confidence);
/* The view without the confidence head, whatever trained the trunk: what `needle
 * calibrate` answers with (the envelope's confidence is then the decoding's alone). */
int lora_view_build_no_confidence(const st_file *ck, lora_view *out);

/* Whether `ck` is a checkpoint of `needle finetune --full` (its "run" metadata says so): the
 * trunk was trained and the probe heads were not (the loss does not reach them), so its
 * confidence head reads hidden states of a network it was never fitted to. */
int lora_full_finetune_checkpoint(const st_file *ck);
/* Whether `needle calibrate` wrote `ck` (its "run" metadata has needle_calibrate): the
 * confidence head was fitted to this trunk, so a build keeps it. */
int lora_calibrated_checkpoint(const st_file *ck);
/* The same for a Needle 2 checkpoint (cactus-needle 2.0.15 build_main): the heads are kept
 * after a merge (2.0.15 drops nothing; its exporter ignores mtp_* by name). */
int lora_view_build_v2(const st_file *ck, const train_adapter *ad, lora_view *out);
void lora_view_release(lora_view *v);

#endif
