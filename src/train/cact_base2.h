/* A Needle 2 .cact as the base of the training core (issue 32: "a base can also be a
 * .cact, dequantized exactly as the runtime does"): every record the network reads, in
 * the positional layout of spec §1.9, widened into the g2 model's float tensors -- CQ
 * records row by row with the runtime's own reader (cq_dequant_row), FP16 / FP32 records
 * as the runtime widens them -- and transposed / reshaped back to the flax tree's layout
 * (kernels [in][out], mHC phi [L][n*d][m], engram tables [tables][slots][sub]). The config
 * comes from the header. Probe heads and the tokenizer are not read. */
#ifndef NEEDLE_TRAIN_CACT_BASE2_H
#define NEEDLE_TRAIN_CACT_BASE2_H

#include <stddef.h>
#include <stdint.h>

#include "export/export_model.h"
#include "train/checkpoint.h"
#include "train/grad2.h"

/* The model of the .cact image [data, data + size) and its config (cfg may be NULL).
 * A Needle 3 file or a malformed one is refused with a needle error and a message. */
int g2_model_from_cact(const uint8_t *data, size_t size, export_config *cfg, g2_model **out);

/* The config as the JSON text export_config_parse reads back to the same struct (the
 * fields a Needle 2 TransformerConfig needs for grad2 and the exporter; malloc'd, NULL when
 * out of memory). */
char *g2_config_json(const export_config *cfg);

/* The .cact as a Needle 2 checkpoint (`needle finetune -w` trains from it, `needle build`
 * merges into it): every tensor of the g2 model (F32, owned), generation 2, the config in
 * the metadata (g2_config_json) with format_version 2, as our 3.x checkpoints carry it
 * (the official 2.0.15 checkpoints are pickles, which we do not write). */
int train_checkpoint_from_cact2(const uint8_t *data, size_t size, train_checkpoint *out);

#endif
