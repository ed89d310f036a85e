/* Needle 2 checkpoint -> .cact, the same file the official exporter writes
 * (cactus-needle 2.0.15 export.write_export with a bits map, a tokenizer and a kv_window).
 *
 * Input: the flax parameter tree as a safetensors file whose tensor names are the tree
 * paths joined by "/" (embedding/embedding, stack/layers/block/self_attn/q_proj/kernel
 * [L, d, A], engrams_0/embedding [T, slots, sub], contrastive_head/proj/kernel, ...), in
 * F32 (F16 / BF16 are widened exactly), and the TransformerConfig as JSON (the fields
 * named in export_config; missing fields take the official defaults, unknown ones are
 * ignored as TransformerConfig(**kw) ignores them).
 *
 * Every tensor the exporter reads must be present with the shape the config implies;
 * other tensors (log_temp, optimizer state, mtp_*) are ignored, as the exporter ignores
 * them. Values must be finite. */
#ifndef NEEDLE_EXPORT_EXPORT_MODEL_H
#define NEEDLE_EXPORT_EXPORT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "export/cact_write.h"
#include "export/safetensors.h"
#include "quant/bits_map.h"
#include "quant/cq_codebook.h"

typedef struct export_config {
    uint32_t vocab_size, d_model, attn_dim, num_heads, num_kv_heads, num_layers, max_seq_len;
    double rope_theta;
    uint32_t engram_orders[8], num_orders, engram_heads, engram_slots;
    uint32_t engram_layers[8], num_sites;
    uint32_t mhc_lanes, kv_window, kv_bits;
    char weight_bits[256]; /* the config's bits map, "" if none */
} export_config;

/* Parses the config JSON text. Returns 0 or NEEDLE_ERR_JSON / NEEDLE_ERR_INVALID_ARGUMENT. */
int export_config_parse(const char *json, size_t len, export_config *cfg);

/* architecture.effective_kv_window: the KV-budget window, capped by config.kv_window. */
uint32_t export_effective_kv_window(const export_config *cfg);

/* Called after each tensor: index, count, the record (CQ: rel_error = ||W - deq|| / ||W||,
 * else -1). */
typedef void (*export_progress_fn)(void *user, uint32_t index, uint32_t count, const cw_tensor *t,
                                   double rel_error);

typedef struct export_options {
    const bits_map *bits;
    uint32_t kv_window;       /* header value */
    const uint8_t *tokenizer; /* RAW blob (spm_tokenizer_blob), or NULL for none */
    size_t tokenizer_size;
    uint32_t tokenizer_pieces;   /* must equal vocab_size */
    export_progress_fn progress; /* may be NULL */
    void *user;
} export_options;

/* Fills `w` (cw_init'd by the caller) with the header, codebooks and every record in the
 * order of spec §1.9. Returns 0, or a negative status with a message naming the tensor. */
int export_build(const st_file *ckpt, const export_config *cfg, const cq_codebooks *cb,
                 const export_options *opt, cact_writer *w);

#endif
