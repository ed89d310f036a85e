/* libFuzzer target for what the training commands (needle finetune, needle grad, needle
 * encode-data) read from the user: the first byte picks a reader, the rest is its input.
 *   0: one fine-tuning data line (ft_render_line: an example or a chat-format line)
 *   1: a .cact as the training base (cact_base_generation, then for Needle 3 the official
 *      checkpoint it came from, train_checkpoint_from_cact, and the g3 model, and for
 *      Needle 2 the g2 model: every record dequantized)
 *   2: a safetensors checkpoint with the g3b geometry of tests/fixtures/grad_v3 (the
 *      official tensor names and shapes checked, the tensors widened to float)
 *   3: a safetensors checkpoint with the g2b geometry of tests/fixtures/grad_v2
 * Build:
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DNEEDLE_SANITIZE=ON -DNEEDLE_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_train
 * Seeds: scripts/fuzz-common.sh (fuzz_seeds train) prefixes the fixtures' data lines, small
 * .cact files and gradient-fixture checkpoints with their selector byte. Every input must
 * be accepted or refused with a status; never a sanitizer report. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "export/export_model.h"
#include "export/export_model_v3.h"
#include "export/safetensors.h"
#include "format/cact.h"
#include "train/cact_base.h"
#include "train/cact_base2.h"
#include "train/cact_base3.h"
#include "train/checkpoint.h"
#include "train/finetune_data.h"
#include "train/grad2.h"
#include "train/grad3.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char g3b_config[] =
    "{\"vocab_size\": 48, \"out_vocab\": 0, \"d_model\": 24, \"num_heads\": 2, \"num_kv_heads\": 1,"
    " \"num_layers\": 2, \"qk_head_dim\": 12, \"v_head_dim\": 8, \"max_seq_len\": 64,"
    " \"rope_theta\": 100000.0, \"sliding_window\": 4, \"global_layers\": [0], \"qkv_conv_taps\": 2,"
    " \"mhc_lanes\": 4, \"engram_orders\": [2], \"engram_heads\": 2, \"engram_seed_heads\": 3,"
    " \"engram_slots\": 11, \"engram_layers\": [0, 1], \"ladder_widths\": []}";

static const char g2b_config[] =
    "{\"vocab_size\": 48, \"d_model\": 24, \"num_heads\": 2, \"num_kv_heads\": 1, \"num_layers\": 2,"
    " \"max_seq_len\": 64, \"rope_theta\": 100000.0, \"mhc_lanes\": 4, \"engram_orders\": [2],"
    " \"engram_heads\": 2, \"engram_slots\": 11, \"engram_layers\": [0, 1]}";

static void data_line(const uint8_t *data, size_t size) {
    ft_rendered r;
    char why[256];
    if (ft_render_line((const char *)data, size, &r, why, sizeof why) == 1) {
        /* a rendered example has its four texts */
        if (!r.prompt || !r.target || !r.tools || !r.answers) abort();
        ft_rendered_free(&r);
    }
}

static void cact_base(const uint8_t *data, size_t size) {
    /* the model is read in place: 64-byte alignment as a mapped file has */
    uint8_t *img = aligned_alloc(64, (size + 63) / 64 * 64);
    if (!img) return;
    memcpy(img, data, size);
    const int gen = cact_base_generation(img, size);
    if (gen == 3) {
        cact_file f;
        if (cact_parse(img, size, &f) == 0) {
            train_checkpoint ck;
            if (train_checkpoint_from_cact(&f, &ck) == 0) train_checkpoint_release(&ck);
            cact_release(&f);
        }
        g3_model *m = NULL;
        if (g3_model_from_cact(img, size, NULL, &m) == 0) g3_model_free(m);
    } else if (gen == 2) {
        g2_model *m = NULL;
        if (g2_model_from_cact(img, size, NULL, &m) == 0) g2_model_free(m);
    }
    free(img);
}

static void checkpoint(const uint8_t *data, size_t size, int generation) {
    st_file ck;
    if (st_parse(data, size, &ck) != 0) return;
    if (generation == 3) {
        export3_config cfg;
        g3_model *m = NULL;
        if (export3_config_parse(g3b_config, sizeof g3b_config - 1, &cfg) == 0 &&
            g3_model_from_checkpoint(&cfg, &ck, &m) == 0)
            g3_model_free(m);
    } else {
        export_config cfg;
        g2_model *m = NULL;
        if (export_config_parse(g2b_config, sizeof g2b_config - 1, &cfg) == 0 &&
            g2_model_from_checkpoint(&cfg, &ck, &m) == 0)
            g2_model_free(m);
    }
    /* every tensor widened as the checkpoint reader widens it */
    for (uint32_t i = 0; i < ck.n; i++) {
        train_tensor t;
        if (train_tensor_from_st(&ck.tensors[i], &t) == 0) train_tensor_release(&t);
    }
    st_release(&ck);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t which = data[0] % 4;
    data++;
    size--;
    if (which == 0) data_line(data, size);
    else if (which == 1) cact_base(data, size);
    else checkpoint(data, size, which == 2 ? 3 : 2);
    return 0;
}
