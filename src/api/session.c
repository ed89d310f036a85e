/* The public session's functions (needle.h), each a thin function over the parts of the
 * composite (session.h): argument checks here, the work in model/ and agent/. */
#include "api/session.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/struct_size.h"

needle_session_params needle_session_default_params(void) { return session_default_params(); }

int needle_session_create(const needle_model *m, const needle_session_params *params,
                          needle_session **out) {
    if (!m || !out) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_create: NULL argument");
    needle_session *s = calloc(1, sizeof *s);
    if (!s) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "session_create: out of memory");
    int rc = session_create(m, params, &s->env.core);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return NEEDLE_OK;
}

void needle_session_free(needle_session *s) {
    if (!s) return;
    chat_free(s->chat);
    session_free(s->env.embedder);
    session_free(s->env.core);
    free(s);
}

void needle_session_reset(needle_session *s) {
    if (!s) return;
    session_reset(s->env.core);
    chat_on_reset(s->chat);
}

int needle_session_eval(needle_session *s, const int32_t *tokens, size_t n, float *logits,
                        size_t cap) {
    if (!s) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_eval: NULL argument");
    return session_eval(s->env.core, tokens, n, logits, cap, chat_cells(s->chat));
}

const float *needle_session_logits(const needle_session *s) {
    return s ? session_logits(s->env.core) : NULL;
}

uint32_t needle_session_position(const needle_session *s) {
    return s ? session_position(s->env.core) : 0;
}

int needle_session_generate(needle_session *s, const int32_t *prompt, size_t n_prompt,
                            const needle_generate_params *params, int32_t *out, size_t cap,
                            size_t *n_out) {
    if (!s) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "session_generate: NULL argument");
    return session_generate(s->env.core, prompt, n_prompt, params, &s->env.cb,
                            chat_cells(s->chat), out, cap, n_out);
}

int needle_session_get_stats(const needle_session *s, needle_session_stats *out) {
    if (!s) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "get_stats: NULL argument");
    return session_get_stats(s->env.core, out);
}

int needle_session_embed(needle_session *s, const char *text, float *out, size_t cap,
                         size_t *n_out) {
    if (!s) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "embed: NULL argument");
    return session_embed_text(s->env.core, &s->env.embedder, text, out, cap, n_out);
}

int needle_session_set_callbacks(needle_session *s, const needle_callbacks *cb) {
    if (!s) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "set_callbacks: NULL session");
    needle_callbacks c;
    memset(&c, 0, sizeof c);
    if (cb) {
        int rc = struct_size_in(&c, cb, sizeof c, "set_callbacks: needle_callbacks");
        if (rc) return rc;
    }
    s->env.cb = c;
    return NEEDLE_OK;
}

int needle_session_set_tools(needle_session *s, const char *system, const char *tools_json) {
    return needle_session_set_tools_ex(s, system, tools_json, NULL);
}

int needle_session_set_tools_ex(needle_session *s, const char *system, const char *tools_json,
                                const needle_tools_params *params) {
    if (!s) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "set_tools: NULL argument");
    return chat_create(&s->env, system, tools_json, params, &s->chat);
}

uint32_t needle_session_prefix_length(const needle_session *s) {
    return s ? chat_prefix_length(s->chat) : 0;
}

int needle_session_complete(needle_session *s, const char *text,
                            const needle_complete_params *params, char *out, size_t cap,
                            size_t *len) {
    if (!s) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "complete: NULL argument");
    if (!s->chat) return needle_fail(NEEDLE_ERR_STATE, "complete: set tools on the session first");
    return chat_complete(s->chat, text, params, out, cap, len);
}

int needle_session_append_turn(needle_session *s, const char *text, int32_t turn,
                               const char *calls_json) {
    if (!s) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "append_turn: NULL argument");
    if (!s->chat)
        return needle_fail(NEEDLE_ERR_STATE, "append_turn: set tools on the session first");
    return chat_append_turn(s->chat, text, turn, calls_json);
}

void api_session_set_logits_hook(needle_session *s, chat_logits_fn fn, void *user) {
    s->env.logits_hook = fn;
    s->env.logits_hook_user = user;
}

void api_session_set_cells_tap(needle_session *s, const session_cells *tap) {
    s->env.cells_tap = tap;
}

model_session *api_session_core(needle_session *s) { return s->env.core; }
