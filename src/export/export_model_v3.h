/* Needle 3 checkpoint -> .cact v3 (tag 0x05E12A84), the file the official exporter of
 * cactus-needle 3.2.8 (export.write_export) writes: the 196-byte header (qk / v head dims,
 * out_vocab, sliding window, global-layer mask, q/k/v conv taps, engram seed heads, 16
 * sites), the per-layer "Monarch" Hadamard-MLP tensors, the FP32 Hadamard permutations
 * (numpy RandomState(11 / 13).permutation, split in halves when ladder_widths is set),
 * the probe heads with CQ4 matrices, and the v3 tokenizer blob.
 *
 * The official packer writes CQ4 only; with the default bits map ("4") the output is
 * byte-identical to it. Other maps are applied (heads stay CQ4, as HEAD_BITS) but have no
 * official reference. Checkpoint naming, dtypes and checks as in export_model.h. */
#ifndef NEEDLE_EXPORT_EXPORT_MODEL_V3_H
#define NEEDLE_EXPORT_EXPORT_MODEL_V3_H

#include <stddef.h>
#include <stdint.h>

#include "export/cact_write.h"
#include "export/export_model.h"
#include "export/safetensors.h"
#include "quant/cq_codebook.h"

typedef struct export3_config {
    uint32_t vocab_size, out_vocab, d_model, num_heads, num_kv_heads, num_layers, qk_head_dim, v_head_dim,
        max_seq_len;
    double rope_theta;
    uint32_t engram_orders[8], num_orders, engram_heads, engram_slots, engram_seed_heads;
    uint32_t engram_layers[32], num_sites;
    uint32_t global_layers[80], num_global;
    uint32_t sliding_window, ladder_split, mhc_lanes, qkv_conv_taps, kv_window, kv_bits;
} export3_config;

/* Parses the TransformerConfig JSON with 3.2.8's defaults and its legacy `attn_dim` rule
 * (sets both head dims, and no window / global layers unless given). */
int export3_config_parse(const char *json, size_t len, export3_config *cfg);

/* architecture.effective_kv_window of 3.2.8 (global layers share the KV budget). */
uint32_t export3_effective_kv_window(const export3_config *cfg);

/* As export_build, for Needle 3 (opt->tokenizer: a spm_tokenizer_blob_v3 blob, with at
 * most vocab_size pieces). */
int export3_build(const st_file *ckpt, const export3_config *cfg, const cq_codebooks *cb,
                  const export_options *opt, cact_writer *w);

#endif
