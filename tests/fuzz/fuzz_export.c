/* libFuzzer target for the exporter's readers: the first byte picks one, the rest is its
 * input. 0: a safetensors checkpoint exported with the tiny fixture geometry (every bits
 * width by the second byte); 1: a SentencePiece .model -> tokenizer blob (v2 or v3 by the
 * second byte); 2: a config JSON and a bits map (split at the first NUL); 3: a safetensors
 * checkpoint exported as Needle 3 with the v3_a fixture geometry; 4: a Needle 3 config. Build:
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DNEEDLE_SANITIZE=ON -DNEEDLE_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_export
 * Seed with tests/fuzz/corpus/export (made from the committed export fixtures). Every input
 * must be accepted or refused with a status; never a sanitizer report. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "export/cact_write.h"
#include "export/export_model.h"
#include "export/export_model_v3.h"
#include "export/safetensors.h"
#include "export/spm_model.h"
#include "quant/bits_map.h"
#include "quant/cq_codebook.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char tiny_config[] =
    "{\"vocab_size\": 512, \"d_model\": 96, \"num_heads\": 4, \"num_kv_heads\": 2, \"num_layers\": 4,"
    " \"max_seq_len\": 128, \"rope_theta\": 10000.0, \"mhc_lanes\": 2, \"engram_orders\": [2, 3],"
    " \"engram_slots\": 64, \"engram_layers\": [1], \"kv_window\": 16}";

static const char v3_config[] =
    "{\"vocab_size\": 512, \"out_vocab\": 500, \"d_model\": 96, \"num_heads\": 4, \"num_kv_heads\": 2,"
    " \"num_layers\": 4, \"qk_head_dim\": 16, \"v_head_dim\": 24, \"max_seq_len\": 128, \"mhc_lanes\": 2,"
    " \"engram_slots\": 64, \"engram_layers\": [1, 3], \"global_layers\": [1, 3], \"sliding_window\": 16,"
    " \"qkv_conv_taps\": 3, \"embedding_dim\": 32, \"ladder_widths\": [2], \"engram_seed_heads\": 3}";

static cq_codebooks cb;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    if (!cb.group && cq_codebooks_init(&cb, 128) != 0) return 0;
    const uint8_t which = data[0] % 5, width = data[1];
    data += 2;
    size -= 2;
    if (which == 0) {
        st_file ck;
        if (st_parse(data, size, &ck) != 0) return 0;
        export_config cfg;
        bits_map map;
        static const char *widths[4] = {"2", "3", "4", "1.58"};
        if (export_config_parse(tiny_config, sizeof tiny_config - 1, &cfg) == 0 &&
            bits_map_parse(widths[width % 4], &map) == 0) {
            cact_writer w;
            cw_init(&w);
            const export_options opt = {.bits = &map, .kv_window = 16};
            if (export_build(&ck, &cfg, &cb, &opt, &w) == 0) {
                uint8_t *image;
                size_t n;
                if (cw_serialize(&w, &image, &n) == 0) free(image);
            }
            cw_release(&w);
        }
        st_release(&ck);
    } else if (which == 1) {
        uint8_t *blob = NULL;
        size_t n;
        uint32_t pieces;
        if ((width & 1 ? spm_tokenizer_blob_v3 : spm_tokenizer_blob)(data, size, &blob, &n, &pieces) == 0)
            free(blob);
    } else if (which == 3) {
        st_file ck;
        if (st_parse(data, size, &ck) != 0) return 0;
        export3_config cfg;
        bits_map map;
        if (export3_config_parse(v3_config, sizeof v3_config - 1, &cfg) == 0 && bits_map_parse("4", &map) == 0) {
            cact_writer w;
            cw_init(&w);
            const export_options opt = {.bits = &map, .kv_window = export3_effective_kv_window(&cfg)};
            if (export3_build(&ck, &cfg, &cb, &opt, &w) == 0) {
                uint8_t *image;
                size_t n;
                if (cw_serialize(&w, &image, &n) == 0) free(image);
            }
            cw_release(&w);
        }
        st_release(&ck);
    } else if (which == 4) {
        export3_config cfg;
        if (export3_config_parse((const char *)data, size, &cfg) == 0) export3_effective_kv_window(&cfg);
    } else {
        const uint8_t *nul = memchr(data, 0, size);
        const size_t cfg_len = nul ? (size_t)(nul - data) : size;
        export_config cfg;
        export_config_parse((const char *)data, cfg_len, &cfg);
        if (nul) {
            char *spec = malloc(size - cfg_len);
            if (!spec) return 0;
            memcpy(spec, nul + 1, size - cfg_len - 1);
            spec[size - cfg_len - 1] = '\0';
            bits_map map;
            if (bits_map_parse(spec, &map) == 0) {
                bits_map_lookup(&map, "layer03.q_proj");
                bits_map_lookup(&map, "engram0.tables");
            }
            free(spec);
        }
    }
    return 0;
}
