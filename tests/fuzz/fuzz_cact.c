/* libFuzzer target for the .cact loader and a short forward pass. Build it with
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DNEEDLE_SANITIZE=ON -DNEEDLE_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_cact
 * Seed it with tests/fixtures/tiny_*.cact. Any input must load cleanly or fail with a
 * status; a loaded model must run a few tokens without a sanitizer report. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "needle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* 64-byte aligned copy, as a mapped file would be */
    void *image = aligned_alloc(64, (size + 63) / 64 * 64 + 64);
    if (!image) return 0;
    memcpy(image, data, size);
    needle_model *m = NULL;
    if (needle_model_open_blob(image, size, NULL, &m) == NEEDLE_OK) {
        needle_model_info info = {.size = sizeof info};
        needle_model_get_info(m, &info);
        /* keep each run short: only small geometries are evaluated */
        if ((uint64_t)info.d_model * info.num_layers <= 4096 && info.vocab <= 4096) {
            needle_session_params sp = needle_session_default_params();
            sp.n_ctx = 8;
            needle_session *s = NULL;
            if (needle_session_create(m, &sp, &s) == NEEDLE_OK) {
                int32_t toks[3] = {2, (int32_t)(info.vocab / 2), (int32_t)(info.vocab - 1)};
                needle_session_eval(s, toks, 3, NULL, 0);
            }
            needle_session_free(s);
        }
        if (info.has_tokenizer) {
            int32_t ids[64];
            size_t n = 0;
            needle_tokenize(m, "hello {\"a\": 1} \xc3\xa9", 18, ids, 64, &n);
        }
        needle_model_free(m);
    }
    free(image);
    return 0;
}
