/* Prompt pieces of a conversation (see prompt.h). */
#include "agent/prompt.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "grammar/json_canon.h"
#include "util/error.h"
#include "util/strbuf.h"

/* Unwraps OpenAI-style entries and returns the tools array as the model was trained on it
 * (Python-compact JSON). Plain arrays are re-serialized straight from the caller's text,
 * which keeps every number exactly as Python would print it. */
int prompt_canonical_tools(const char *tools_json, char **out, size_t *out_len) {
    cJSON *root = cJSON_Parse(tools_json);
    if (!root) return grammar_json_canon(tools_json, strlen(tools_json), out, out_len);
    int wrapped = 0;
    const cJSON *item;
    if (cJSON_IsArray(root))
        cJSON_ArrayForEach(item, root) if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(item, "function"))) wrapped = 1;
    if (!wrapped) {
        cJSON_Delete(root);
        return grammar_json_canon(tools_json, strlen(tools_json), out, out_len);
    }
    cJSON *flat = cJSON_CreateArray();
    cJSON_ArrayForEach(item, root) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(item, "function");
        cJSON_AddItemToArray(flat, cJSON_Duplicate(cJSON_IsObject(fn) ? fn : item, 1));
    }
    char *text = cJSON_PrintUnformatted(flat);
    cJSON_Delete(flat);
    cJSON_Delete(root);
    if (!text) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "tools: out of memory");
    int rc = grammar_json_canon(text, strlen(text), out, out_len);
    cJSON_free(text);
    return rc;
}

/* Encodes text into a freshly malloc'd id array. */
int prompt_encode_alloc(const tokenizer *tok, const char *text, size_t len, int dummy,
                        int32_t **ids, size_t *n) {
    size_t need = 0;
    int rc = tokenizer_encode_ex(tok, text, len, dummy, NULL, 0, &need);
    if (rc && rc != NEEDLE_ERR_BUFFER_TOO_SMALL) return rc;
    *ids = malloc((need ? need : 1) * sizeof **ids);
    if (!*ids) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    rc = tokenizer_encode_ex(tok, text, len, dummy, *ids, need, n);
    if (rc) {
        free(*ids);
        *ids = NULL;
    }
    return rc;
}

/* The grammar of a tools array, with the official engine's documented rule: with one
 * declared tool it admits exactly one call of that name (extraction), so no refusal. */
int prompt_compile_tools(const char *tools, size_t len, grammar **out) {
    int rc = grammar_compile(tools, len, NULL, out);
    if (rc || grammar_tool_count(*out) != 1) return rc;
    grammar_options one = grammar_default_options();
    one.allow_empty = 0;
    one.single_call = 1;
    grammar_free(*out);
    *out = NULL;
    return grammar_compile(tools, len, &one, out);
}

/* [BOS] + the static prefix of system facts and tools, as token ids (malloc'd). */
int prompt_prefix_ids(const struct needle_model *m, const char *system, const char *tools,
                      size_t tools_len, int32_t **ids, size_t *n_ids) {
    strbuf prompt = {0};
    if (*system) {
        strbuf_puts(&prompt, "<|im_start|>system\n");
        strbuf_puts(&prompt, system);
        strbuf_puts(&prompt, "<|im_end|>\n");
    }
    strbuf_puts(&prompt, "<|im_start|>user\n<tools>");
    strbuf_put(&prompt, tools, tools_len);
    strbuf_puts(&prompt, "</tools>");
    if (prompt.oom) {
        free(prompt.data);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "set_tools: out of memory");
    }
    int32_t *body;
    size_t n_body;
    int rc = prompt_encode_alloc(model_tokenizer(m), prompt.data, prompt.len, 1, &body, &n_body);
    free(prompt.data);
    if (rc) return rc;
    *ids = malloc((n_body + 1) * sizeof **ids);
    if (!*ids) {
        free(body);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "set_tools: out of memory");
    }
    (*ids)[0] = NEEDLE_TOKEN_BOS;
    memcpy(*ids + 1, body, n_body * sizeof **ids);
    free(body);
    *n_ids = n_body + 1;
    return NEEDLE_OK;
}
