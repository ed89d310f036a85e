/* libFuzzer target for the chat input path: needle_session_set_tools and
 * needle_session_complete on a tiny model (random weights, its own tokenizer), through the
 * public API only: the tiny fixture checkpoint cut to one layer and exported at build time
 * (tests/fuzz/make_chat_model.py), so that an execution costs milliseconds.
 *
 * Input: tools JSON, a NUL byte, then the query. Without a NUL the whole input is the
 * query and the tools are a fixed two-tool declaration. Turns are kept short
 * (max_new_tokens 24) so each run takes milliseconds. Any input must give a status, and a
 * completed turn an envelope that parses as JSON. NEEDLE_FUZZ_MODEL overrides the model. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "needle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *FIXED_TOOLS =
    "[{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\",\"maxLength\":24},\"unit\":{\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\"]}},{\"name\":\"set_timer\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"minutes\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":120}}}}]";

static needle_session *session(void) {
    static needle_model *model;
    static needle_session *s;
    if (s) return s;
    const char *path = getenv("NEEDLE_FUZZ_MODEL");
    if (!path) path = NEEDLE_FUZZ_CHAT_MODEL;
    /* one thread: a campaign is one process per core, and a pool's second thread polling
     * between the tiny model's products took as much CPU as the work (and a core that
     * another job needs) */
    needle_model_params mp = needle_model_default_params();
    mp.n_threads = 1;
    if (needle_model_open(path, &mp, &model) != NEEDLE_OK) {
        fprintf(stderr, "fuzz_chat: cannot open %s: %s\n", path, needle_last_error());
        exit(1);
    }
    needle_session_params sp = needle_session_default_params();
    sp.n_ctx = 4096;
    if (needle_session_create(model, &sp, &s) != NEEDLE_OK) {
        fprintf(stderr, "fuzz_chat: session: %s\n", needle_last_error());
        exit(1);
    }
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0; /* the context holds the tools and the query */
    needle_session *s = session();
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    const char *tools = FIXED_TOOLS, *query = buf;
    const char *nul = memchr(buf, 0, size);
    if (nul) {
        tools = buf;
        query = nul + 1;
    }
    if (needle_session_set_tools(s, "", tools) == NEEDLE_OK) {
        static char out[1 << 16];
        needle_complete_params p = needle_complete_default_params();
        p.max_new_tokens = 24;
        p.max_think_tokens = 4;
        p.seed = size;
        p.temperature = size & 1 ? 0.7f : 0.0f;
        size_t len = 0;
        if (needle_session_complete(s, query, &p, out, sizeof out, &len) == NEEDLE_OK) {
            cJSON *env = cJSON_Parse(out);
            if (!env) {
                fprintf(stderr, "envelope is not JSON: %s\n", out);
                abort();
            }
            cJSON_Delete(env);
        }
    }
    free(buf);
    return 0;
}
