/* libFuzzer target for the server's request parser (tools/serve/openai.c): the body of a
 * POST /v1/chat/completions (selector byte even) or /v1/needle/complete (odd), as
 * libmicrohttpd hands it over (the HTTP framing itself is libmicrohttpd's). Any body must
 * give a job or a refusal: an HTTP status 4xx/5xx with a code and a message. A job holds
 * at least one turn, NUL-terminated texts, tools that parse as a JSON array (or none),
 * and a known chat kind; its error body parses as JSON. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve/serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void require(int ok, const char *what, const uint8_t *data, size_t size) {
    if (ok) return;
    fprintf(stderr, "fuzz_openai: %s (body %zu bytes: %.*s)\n", what, size, (int)(size > 300 ? 300 : size),
            (const char *)data);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    /* the server's limits, tight enough that the fuzzer reaches them */
    const serve_config cfg = {.model_name = "needle", .n_ctx = 1024, .max_body = 1 << 16, .max_depth = 16,
                              .max_tools = 8, .max_messages = 8, .max_tokens = 512, .timeout_s = 10};
    const int needle_api = data[0] & 1;
    const char *body = (const char *)data + 1;
    const size_t len = size - 1;
    int status = 0;
    char *code = NULL, *message = NULL;
    job *j = needle_api ? openai_parse_needle(body, len, &cfg, &status, &code, &message)
                        : openai_parse_chat(body, len, &cfg, &status, &code, &message);
    if (!j) {
        require(status >= 400 && status < 600, "a refusal without an HTTP error status", data, size);
        require(code && message && *code && *message, "a refusal without a code and a message", data, size);
        char *err = openai_error_body(status, code, message);
        cJSON *e = err ? cJSON_Parse(err) : NULL;
        require(e != NULL, "the error body is not JSON", data, size);
        cJSON_Delete(e);
        free(err);
    } else {
        require(j->n_turns >= 1 && j->turns, "a job without a turn", data, size);
        for (size_t i = 0; i < j->n_turns; i++) require(j->turns[i].text != NULL, "a turn without text", data, size);
        require(j->turns[j->n_turns - 1].calls == NULL, "the turn to answer has calls", data, size);
        if (j->tools) {
            cJSON *t = cJSON_Parse(j->tools);
            require(cJSON_IsArray(t), "the job's tools are not a JSON array", data, size);
            cJSON_Delete(t);
        }
        require(j->chat_kind >= CHAT_TOOLS && j->chat_kind <= CHAT_NONE, "an unknown chat kind", data, size);
        require(j->params.max_new_tokens <= (int32_t)cfg.max_tokens || j->params.max_new_tokens <= 0,
                "max_tokens above the server's cap", data, size);
        job_release(j);
    }
    free(code);
    free(message);
    return 0;
}
