/* What `needle build` does to an official Needle 3 checkpoint before the exporter sees it
 * (cactus-needle 3.2.8, model/build.py and model/finetune.merge_lora):
 *
 *   - the checkpoint's metadata: format_version 2 and the TransformerConfig as JSON,
 *     normalized as TransformerConfig.from_saved does (unknown keys dropped, the newer
 *     keys defaulted to "off");
 *   - an official LoRA adapter (checkpoints.write_adapter: tensors lora/<path>/A and
 *     lora/<path>/B, JSON metadata scale, base, rank, seed, pieces, languages);
 *   - the merge W += scale * A @ B for every adapted kernel, in float32 then cast to the
 *     kernel's stored dtype, as jax computes it on the CPU: each product element is a
 *     chain of fused multiply-adds over the rank whose split into accumulators follows
 *     XLA's CPU dot kernel for that output width (see lora_matmul), so the merged
 *     weights are the official ones bit for bit;
 *   - the view the exporter reads: mtp_* heads dropped (run.load_checkpoint), the
 *     confidence head dropped when an adapter was merged (build.build_main). */
#ifndef NEEDLE_TRAIN_LORA_MERGE_H
#define NEEDLE_TRAIN_LORA_MERGE_H

#include <stddef.h>
#include <stdint.h>

#include "export/safetensors.h"

/* The checkpoint format version build accepts (run.CHECKPOINT_FORMAT_VERSION). */
#define LORA_CHECKPOINT_FORMAT_VERSION 2

/* The string value of __metadata__[key] of a safetensors image (malloc'd), or NULL when
 * the file has no such entry. Returns 0 or NEEDLE_ERR_FORMAT / _OUT_OF_MEMORY. */
int st_metadata_string(const uint8_t *image, size_t size, const char *key, char **out);

/* The checkpoint's config as from_saved sees it (malloc'd JSON text), after checking
 * format_version and refusing Needle 2 checkpoints. `path` is for messages. */
int lora_checkpoint_config(const uint8_t *image, size_t size, const char *path, char **config_json);

typedef struct lora_group {
    char *key;              /* the adapted tensor's path, e.g. stack/layers/block/self_attn/q_proj/kernel */
    const st_tensor *a, *b; /* [lead..., in, rank], [lead..., rank, out] */
} lora_group;

typedef struct lora_adapter {
    st_file st;
    lora_group *groups;
    uint32_t n;
    double scale;
    char *base;   /* the checkpoint it was trained on (metadata "base"), or NULL */
    int whistle;  /* metadata "languages" set: a speech adapter, built by another command */
} lora_adapter;

/* Parses an adapter image (which must outlive the adapter). Returns 0 or a negative
 * status with the error message set. */
int lora_adapter_parse(const uint8_t *image, size_t size, lora_adapter *out);
void lora_adapter_release(lora_adapter *ad);

/* out[lead][in][out] = A @ B in float32 with XLA's CPU summation order. */
void lora_matmul(const st_tensor *a, const st_tensor *b, uint64_t lead, uint64_t in, uint64_t rank,
                 uint64_t outd, float *out);

/* The checkpoint as the exporter reads it after the build's changes: a view whose
 * tensors point into the checkpoint image, except the merged ones (owned here). */
typedef struct lora_view {
    st_file st;
    uint8_t **owned;
    uint32_t n_owned;
} lora_view;

/* Builds the view of `ck`: mtp_* dropped; with an adapter (may be NULL), every group
 * merged and the confidence head dropped (*dropped_confidence set when there was one). */
int lora_view_build(const st_file *ck, const lora_adapter *ad, lora_view *out, int *dropped_confidence);
void lora_view_release(lora_view *v);

#endif
