/* Conversations with tools: prompt rendering, the constrained decode of one assistant turn,
 * and the envelope (spec §7-8).
 *
 * Template: cactus-needle 2.0.15, finetune.render_example. A conversation is
 *   [BOS] "<|im_start|>system\n" SYSTEM "<|im_end|>\n"        (only if SYSTEM is non-empty)
 *         "<|im_start|>user\n<tools>" TOOLS "</tools>"         <- static prefix, cached
 *         "\n" QUERY "<|im_end|>\n<|im_start|>assistant\n"     <- first turn
 *   assistant: "▁" ["<think>\n" REASONING "\n</think>\n"] "<tool_call>" CALLS "</tool_call><|im_end|>"
 * and, our choice where the package is silent (spec §8.6), later turns continue with
 *   "\n<|im_start|>user\n<tool_result>" RESULT "</tool_result><|im_end|>\n<|im_start|>assistant\n"
 *   "\n<|im_start|>user\n" QUERY "<|im_end|>\n<|im_start|>assistant\n"
 * Every piece after the first starts right after a marker, and markers split the text
 * into independently encoded segments, so encoding piece by piece (without the dummy
 * prefix) gives exactly the ids of encoding the whole conversation at once.
 *
 * Decoding is a small state machine: optional "▁", then either <think> (free text up to
 * max_think_tokens, then </think> and "\n" forced) or <tool_call>; then the call array,
 * constrained byte by byte by the grammar compiled from the schemas; then </tool_call> and
 * <|im_end|> forced. Forced tokens skip the logits (no choice to make). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "agent/chat.h"
#include "agent/envelope.h"
#include "grammar/grammar.h"
#include "grammar/json_canon.h"
#include "model/session.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/strbuf.h"
#include "util/struct_size.h"


static const char *const MARKER_TEXT[] = {"<think>", "</think>", "<tool_call>", "</tool_call>",
                                          "<|im_end|>", "<|im_start|>"};

struct chat {
    grammar *g;         /* any number of calls, [] allowed */
    grammar *g_extract; /* exactly one call (compiled on first use) */
    char *tools;        /* canonical tools JSON, for g_extract */
    size_t tools_len;
    grammar_trie *trie;
    int32_t id_think, id_end_think, id_call, id_end_call, id_im_end, id_im_start, id_space;
    int32_t newline[8];
    size_t n_newline;
    const tokenizer *tok; /* the model's */
    uint32_t vocab;
    uint32_t prefix_len;  /* the session's base (needle_session_reset) is the prefix end */
    int last_turn_called; /* the previous envelope was a "call" with calls */
    session_checkpoint turn_start; /* the conversation before the current turn */
    uint8_t *allowed;     /* [vocab] */
    char *close_buf;      /* [max_new_tokens] scratch walk for the budget check */
    char *plan_buf;       /* [max_new_tokens] a verified ending from the current state */
    grammar_state probe;  /* scratch state for the budget check */
    size_t close_cap;
};

/* The conversation attached to s by set_tools, or NULL. */
static struct chat *chat_of(const needle_session *s) {
    return (struct chat *)session_extension(s);
}

/* needle_session_reset started the conversation again after the prefix. */
static void chat_on_reset(void *ext) {
    struct chat *c = ext;
    c->last_turn_called = 0;
}

static void chat_free_ext(void *ext) { chat_free(ext); }

void chat_free(struct chat *c) {
    if (!c) return;
    grammar_free(c->g);
    grammar_free(c->g_extract);
    free(c->tools);
    grammar_trie_free(c->trie);
    free(c->allowed);
    free(c->close_buf);
    free(c->plan_buf);
    session_checkpoint_free(&c->turn_start);
    free(c);
}

needle_complete_params needle_complete_default_params(void) {
    needle_complete_params p;
    memset(&p, 0, sizeof p);
    p.size = sizeof p;
    p.max_new_tokens = 256;
    p.max_think_tokens = 64;
    return p;
}

/* Unwraps OpenAI-style entries and returns the tools array as the model was trained on it
 * (Python-compact JSON). Plain arrays are re-serialized straight from the caller's text,
 * which keeps every number exactly as Python would print it. */
static int canonical_tools(const char *tools_json, char **out, size_t *out_len) {
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
static int encode_alloc(const tokenizer *tok, const char *text, size_t len, int dummy,
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

static int build_trie(struct chat *c, const tokenizer *tok, uint32_t vocab) {
    const char **bytes = malloc(vocab * sizeof *bytes);
    size_t *lens = malloc(vocab * sizeof *lens);
    if (!bytes || !lens) {
        free(bytes);
        free(lens);
        return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (uint32_t v = 0; v < vocab; v++) {
        int type = tokenizer_piece_type(tok, (int32_t)v);
        /* control, unknown and marker pieces never appear inside the JSON */
        if (type == TOKENIZER_CONTROL || type == TOKENIZER_UNKNOWN || type == TOKENIZER_USER_DEFINED ||
            tokenizer_token_bytes(tok, (int32_t)v, &bytes[v], &lens[v]) != NEEDLE_OK) {
            bytes[v] = "";
            lens[v] = 0;
        }
    }
    int rc = grammar_trie_build(bytes, lens, vocab, &c->trie);
    free(bytes);
    free(lens);
    return rc;
}

int needle_session_set_tools(needle_session *s, const char *system, const char *tools_json) {
    if (!s || !tools_json)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "set_tools: NULL argument");
    const struct needle_model *m = session_model(s);
    if (!m->tok) return needle_fail(NEEDLE_ERR_NO_TOKENIZER, "set_tools: the model has no tokenizer");
    if (!system) system = "";

    struct chat *c = calloc(1, sizeof *c);
    char *tools = NULL;
    int32_t *ids = NULL;
    size_t tools_len = 0, n_ids = 0;
    strbuf prompt = {0};
    int rc;
    if (!c) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "set_tools: out of memory");
    if ((rc = canonical_tools(tools_json, &tools, &tools_len))) goto fail;
    if ((rc = grammar_compile(tools, tools_len, NULL, &c->g))) goto fail;
    if (grammar_tool_count(c->g) == 1) {
        /* The official engine's documented rule: with one declared tool the grammar admits
         * exactly one call of that name (extraction), so there is no refusal. */
        grammar_options one = grammar_default_options();
        one.allow_empty = 0;
        one.single_call = 1;
        grammar_free(c->g);
        c->g = NULL;
        if ((rc = grammar_compile(tools, tools_len, &one, &c->g))) goto fail;
    }
    c->tok = m->tok;
    c->vocab = m->w.vocab;
    if ((rc = build_trie(c, m->tok, m->w.vocab))) goto fail;

    c->id_think = tokenizer_marker_id(m->tok, "<think>");
    c->id_end_think = tokenizer_marker_id(m->tok, "</think>");
    c->id_call = tokenizer_marker_id(m->tok, "<tool_call>");
    c->id_end_call = tokenizer_marker_id(m->tok, "</tool_call>");
    c->id_im_end = tokenizer_marker_id(m->tok, "<|im_end|>");
    c->id_im_start = tokenizer_marker_id(m->tok, "<|im_start|>");
    const int32_t markers[] = {c->id_think, c->id_end_think, c->id_call, c->id_end_call,
                               c->id_im_end, c->id_im_start};
    for (size_t i = 0; i < sizeof markers / sizeof markers[0]; i++)
        if (markers[i] < 0) {
            rc = needle_fail(NEEDLE_ERR_FORMAT, "set_tools: the tokenizer lacks the marker %s",
                             MARKER_TEXT[i]);
            goto fail;
        }
    /* the dummy-prefix piece the trained target starts with, and the ids of "\n" */
    int32_t sp[4];
    size_t n_sp = 0;
    c->id_space = -1;
    if (tokenizer_encode_ex(m->tok, "<tool_call>", 11, 1, sp, 4, &n_sp) == NEEDLE_OK && n_sp == 2 &&
        sp[1] == c->id_call)
        c->id_space = sp[0];
    if ((rc = tokenizer_encode_ex(m->tok, "\n", 1, 0, c->newline, 8, &c->n_newline))) goto fail;
    c->allowed = malloc(m->w.vocab);
    if (!c->allowed) {
        rc = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "set_tools: out of memory");
        goto fail;
    }

    if (*system) {
        strbuf_puts(&prompt, "<|im_start|>system\n");
        strbuf_puts(&prompt, system);
        strbuf_puts(&prompt, "<|im_end|>\n");
    }
    strbuf_puts(&prompt, "<|im_start|>user\n<tools>");
    strbuf_put(&prompt, tools, tools_len);
    strbuf_puts(&prompt, "</tools>");
    if (prompt.oom) {
        rc = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "set_tools: out of memory");
        goto fail;
    }
    int32_t *body;
    size_t n_body;
    if ((rc = encode_alloc(m->tok, prompt.data, prompt.len, 1, &body, &n_body))) goto fail;
    ids = malloc((n_body + 1) * sizeof *ids);
    if (!ids) {
        free(body);
        rc = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "set_tools: out of memory");
        goto fail;
    }
    ids[0] = NEEDLE_TOKEN_BOS;
    memcpy(ids + 1, body, n_body * sizeof *ids);
    free(body);
    n_ids = n_body + 1;
    if (n_ids >= session_context_length(s)) {
        rc = needle_fail(NEEDLE_ERR_CONTEXT_FULL, "set_tools: the system and tools prefix is %zu "
                         "tokens, the context holds %u", n_ids, session_context_length(s));
        goto fail;
    }

    /* The previous tools' conversation ends here. (Rewinding it instead would restore
     * its prefix position, so the new prefix would be appended after the old one.) */
    session_set_extension(s, NULL, NULL, NULL);
    /* With a sliding window the prefix is pinned as attention sinks, so the tools stay
     * visible however long the conversation grows. configure_sinks starts at position 0;
     * the end of the prefix becomes the base needle_session_reset returns to. */
    const uint32_t window = session_window(s);
    if ((rc = session_configure_sinks(s, window ? (uint32_t)n_ids : 0))) goto fail;
    if ((rc = session_run(s, ids, (uint32_t)n_ids, NULL, 0))) goto fail;
    if ((rc = session_set_base(s))) goto fail;
    session_stats(s)->prefix_evaluations++;
    c->prefix_len = (uint32_t)n_ids;

    c->tools = tools;
    c->tools_len = tools_len;
    session_set_extension(s, c, chat_on_reset, chat_free_ext);
    free(ids);
    free(prompt.data);
    needle_clear_error();
    return NEEDLE_OK;

fail:
    chat_free(c);
    free(tools);
    free(ids);
    free(prompt.data);
    return rc;
}

uint32_t needle_session_prefix_length(const needle_session *s) {
    const struct chat *c = s ? chat_of(s) : NULL;
    return c ? c->prefix_len : 0;
}

enum phase { PH_START, PH_AFTER_SPACE, PH_THINK, PH_NEWLINE, PH_CALL_OPEN, PH_JSON, PH_CLOSE,
             PH_END, PH_DONE };

typedef struct turn {
    const grammar *g;
    enum phase phase;
    uint32_t left;        /* tokens left in the budget, this one included */
    size_t min_json;      /* bytes of the shortest call array from the start */
    size_t plan_len, plan_pos; /* the verified ending in chat.plan_buf, and how far it ran */
    int closing;          /* following the plan to the end */
    uint32_t think_tokens, newline_index;
    grammar_state gs;
    strbuf reasoning_ids; /* int32 ids of the reasoning, as bytes */
    strbuf calls;         /* the call array text */
} turn;

/* Fills c->allowed for the current phase; returns the number of allowed tokens and the
 * single forced token in *forced when there is exactly one. */
static uint32_t allowed_tokens(needle_session *s, turn *t, uint32_t max_think, int32_t *forced) {
    struct chat *c = chat_of(s);
    const uint32_t V = c->vocab;
    uint8_t *a = c->allowed;
    int32_t only = -1;
    switch (t->phase) {
    case PH_START:
        memset(a, 0, V);
        a[c->id_think] = a[c->id_call] = 1;
        if (c->id_space >= 0) a[c->id_space] = 1;
        *forced = -1;
        return 2 + (c->id_space >= 0);
    case PH_AFTER_SPACE:
        memset(a, 0, V);
        a[c->id_think] = a[c->id_call] = 1;
        *forced = -1;
        return 2;
    case PH_THINK: {
        /* stop thinking when the cap is reached or when the rest of the budget is only
         * just enough for "</think>\n<tool_call>", the shortest call array, and the two
         * closing markers */
        if (t->think_tokens >= max_think || t->left <= t->min_json + c->n_newline + 4) {
            only = c->id_end_think;
            break;
        }
        uint32_t n = 0;
        for (uint32_t v = 0; v < V; v++) {
            int type = tokenizer_piece_type(c->tok, (int32_t)v);
            a[v] = type == TOKENIZER_NORMAL || type == TOKENIZER_BYTE;
            n += a[v];
        }
        a[c->id_end_think] = 1;
        *forced = -1;
        return n + 1;
    }
    case PH_NEWLINE: only = c->newline[t->newline_index]; break;
    case PH_CALL_OPEN: only = c->id_call; break;
    case PH_JSON: {
        double t0 = util_clock_ms();
        uint32_t n = grammar_mask(t->g, &t->gs, c->trie, a);
        session_stats(s)->grammar_ms += util_clock_ms() - t0;
        if (grammar_is_complete(t->g, &t->gs)) {
            a[c->id_end_call] = 1;
            n++;
        }
        if (n == 1) {
            for (uint32_t v = 0; v < V; v++)
                if (a[v]) *forced = (int32_t)v;
        } else {
            *forced = -1;
        }
        return n;
    }
    case PH_CLOSE: only = c->id_im_end; break;
    default: *forced = -1; return 0;
    }
    memset(a, 0, V);
    a[only] = 1;
    *forced = only;
    return 1;
}

/* Bytes that end the call array from `from` (grammar_complete: required properties,
 * minimal items and lengths, shortest pattern matches), if they fit in cap. Returns the
 * length, 0 when they do not fit. */
static size_t closing_bytes(const grammar *g, const grammar_state *from, char *out, size_t cap) {
    size_t n = 0;
    return grammar_complete(g, from, out, cap, &n) == NEEDLE_OK ? n : 0;
}

/* Near the end of the token budget: the allowed token that covers the longest prefix of
 * the closing bytes, so that the turn always ends with a complete, valid call array. */
static int32_t closing_token(const needle_session *s, const uint8_t *allowed, const char *close,
                             size_t n_close) {
    const struct chat *c = chat_of(s);
    int32_t best = -1;
    size_t best_len = 0;
    for (uint32_t v = 0; v < c->vocab; v++) {
        if (!allowed[v]) continue;
        const char *b;
        size_t n;
        if (tokenizer_token_bytes(c->tok, (int32_t)v, &b, &n) != NEEDLE_OK) continue;
        if (n > best_len && n <= n_close && !memcmp(b, close, n)) {
            best = (int32_t)v;
            best_len = n;
        }
    }
    return best;
}

/* Whether, after `tok`, a valid ending still fits in the budget: `left` tokens remain
 * including tok, and </tool_call> and <|im_end|> must follow the array. On success the
 * ending found is in c->close_buf, *len bytes (0 when tok completes the array). */
static int fits_budget(needle_session *s, const turn *t, int32_t tok, uint32_t left, size_t *len) {
    struct chat *c = chat_of(s);
    *len = 0;
    if (left < 3) return 0;
    const char *b;
    size_t n;
    if (tokenizer_token_bytes(c->tok, tok, &b, &n) != NEEDLE_OK) return 0;
    grammar_state_copy(&c->probe, &t->gs);
    if (!grammar_accept_bytes(t->g, &c->probe, b, n)) return 0;
    if (grammar_is_complete(t->g, &c->probe)) return 1;
    *len = left > 3 ? closing_bytes(t->g, &c->probe, c->close_buf, left - 3) : 0;
    return *len > 0;
}

static void advance(needle_session *s, turn *t, int32_t tok) {
    struct chat *c = chat_of(s);
    switch (t->phase) {
    case PH_START:
        t->phase = tok == c->id_space ? PH_AFTER_SPACE : tok == c->id_think ? PH_THINK : PH_JSON;
        break;
    case PH_AFTER_SPACE: t->phase = tok == c->id_think ? PH_THINK : PH_JSON; break;
    case PH_THINK:
        if (tok == c->id_end_think) {
            t->phase = c->n_newline ? PH_NEWLINE : PH_CALL_OPEN;
        } else {
            strbuf_put(&t->reasoning_ids, (const char *)&tok, sizeof tok);
            t->think_tokens++;
        }
        break;
    case PH_NEWLINE:
        if (++t->newline_index == c->n_newline) t->phase = PH_CALL_OPEN;
        break;
    case PH_CALL_OPEN: t->phase = PH_JSON; break;
    case PH_JSON:
        if (tok == c->id_end_call) {
            t->phase = PH_CLOSE;
        } else {
            const char *b;
            size_t n;
            tokenizer_token_bytes(c->tok, tok, &b, &n);
            grammar_accept_bytes(t->g, &t->gs, b, n);
            strbuf_put(&t->calls, b, n);
        }
        break;
    case PH_CLOSE: t->phase = PH_DONE; break;
    default: break;
    }
}

/* Renders the turn text that precedes the assistant's answer. */
static int render_turn(needle_session *s, const char *text, int is_result, strbuf *out) {
    struct chat *c = chat_of(s);
    if (needle_session_position(s) == c->prefix_len && !is_result) {
        strbuf_puts(out, "\n");
        strbuf_puts(out, text);
    } else if (is_result) {
        strbuf_puts(out, "\n<|im_start|>user\n<tool_result>");
        /* results that are JSON are re-serialized like the training data; other text is
         * passed through */
        char *canon = NULL;
        size_t canon_len = 0;
        if (grammar_json_canon(text, strlen(text), &canon, &canon_len) == NEEDLE_OK) strbuf_put(out, canon, canon_len);
        else strbuf_puts(out, text);
        free(canon);
        strbuf_puts(out, "</tool_result>");
    } else {
        strbuf_puts(out, "\n<|im_start|>user\n");
        strbuf_puts(out, text);
    }
    strbuf_puts(out, "<|im_end|>\n<|im_start|>assistant\n");
    return out->oom ? needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "out of memory") : NEEDLE_OK;
}

/* After a failed turn: the conversation as it was before it (turn_start covers every
 * position a turn can add; the prefix is only the fallback should that ever fail). A hard
 * error's message (rc) survives the fallback's. */
static void roll_back(needle_session *s, struct chat *c, int last_turn_called, int rc) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", needle_last_error());
    if (session_checkpoint_restore(s, &c->turn_start) == NEEDLE_OK) {
        c->last_turn_called = last_turn_called;
        return;
    }
    needle_session_reset(s);
    if (rc) needle_fail(rc, "%s", msg);
}

/* Decode shortcuts (issue 14), on unless the variable is "0": NEEDLE_JUMP_FORWARD runs
 * a run of forced tokens as one chunk instead of one step each; NEEDLE_SPARSE_LOGITS
 * computes only the allowed ids' rows of the output projection when they are few. A
 * forced token reads no logits, and the pick reads only allowed ids, whose values the
 * sparse product computes exactly as the full one does, so sparse logits never change a
 * token; a chunk differs from single steps only by float rounding in the products (the
 * tests compare whole turns with and without both). */
static int env_is_zero(const char *name) {
    const char *v = getenv(name);
    return v && !strcmp(v, "0");
}

#define SPARSE_RUNS_MAX 64

/* Evaluates the generated tokens pend[0..n); with need_logits, the logits for the next
 * pick: only the allowed ids' when there are at most vocab/4 of them (n_allowed; pass the
 * vocabulary size to always take all) in at most SPARSE_RUNS_MAX runs of consecutive
 * ids. rows: [vocab] scratch. */
static int run_pending(needle_session *s, const int32_t *pend, uint32_t n, int need_logits,
                       uint32_t n_allowed, int32_t *rows) {
    const struct chat *c = chat_of(s);
    if (need_logits && n_allowed <= c->vocab / 4) {
        uint32_t k = 0, runs = 0;
        for (uint32_t v = 0; v < c->vocab; v++)
            if (c->allowed[v]) {
                runs += k == 0 || rows[k - 1] != (int32_t)v - 1;
                rows[k++] = (int32_t)v;
            }
        /* scattered ids cost a product per run of consecutive ids: then all of them */
        if (runs <= SPARSE_RUNS_MAX) return session_run_rows(s, pend, n, rows, k);
    }
    return session_run(s, pend, n, NULL, need_logits);
}

int needle_session_complete(needle_session *s, const char *text, const needle_complete_params *params,
                            char *out, size_t cap, size_t *len) {
    if (!s || !text || !len || (!out && cap))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "complete: NULL argument");
    struct chat *c = chat_of(s);
    if (!c) return needle_fail(NEEDLE_ERR_STATE, "complete: set tools on the session first");
    const uint32_t n_ctx = session_context_length(s);
    needle_complete_params p = needle_complete_default_params();
    int size_rc = struct_size_in(&p, params, sizeof p, "complete: needle_complete_params");
    if (size_rc) return size_rc;
    if (p.max_new_tokens <= 0) p.max_new_tokens = 256;
    if (p.max_think_tokens == 0) p.max_think_tokens = 64;
    if (!(p.temperature >= 0.0f) || !isfinite(p.temperature))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "complete: temperature must be >= 0");
    const int is_result = p.turn == NEEDLE_TURN_TOOL_RESULT ||
                          (p.turn == NEEDLE_TURN_AUTO && c->last_turn_called);
    envelope e = {is_result ? "respond" : "call", 0, NULL, NULL, "[]", "", 0, 0, 0};
    const int last_turn_called = c->last_turn_called;
    int saved = 0; /* turn_start holds this turn's starting point */
    /* Every exit goes through `done`, which rolls a failed turn back. */
    turn t;
    memset(&t, 0, sizeof t);
    char *reasoning = NULL;
    int32_t *pend = NULL, *rows = NULL;

    strbuf chunk = {0};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = render_turn(s, text, is_result, &chunk);
    if (rc == NEEDLE_OK) rc = encode_alloc(c->tok, chunk.data, chunk.len, 0, &ids, &n_ids);
    free(chunk.data);
    if (rc == NEEDLE_ERR_INVALID_UTF8) {
        e.error = needle_last_error();
        e.error_code = "invalid_input";
        goto write;
    }
    if (rc) goto done;
    if (n_ids + 4 > n_ctx - needle_session_position(s)) {
        free(ids);
        e.error = "the conversation does not fit in the context; reset the session";
        e.error_code = "context_full";
        goto write;
    }
    /* the turn evaluates its n_ids tokens and at most max_new_tokens more */
    if ((rc = session_checkpoint_save(s, &c->turn_start,
                                      (uint32_t)n_ids + (uint32_t)p.max_new_tokens))) {
        free(ids);
        goto done;
    }
    saved = 1;
    double t0 = util_clock_ms();
    rc = session_run(s, ids, (uint32_t)n_ids, NULL, 1);
    free(ids);
    if (rc) goto done;
    double t_prefill = util_clock_ms() - t0;
    e.prefill_tps = t_prefill > 0 ? n_ids / (t_prefill / 1e3) : 0;

    if (c->close_cap < (size_t)p.max_new_tokens) {
        char *buf = realloc(c->close_buf, (size_t)p.max_new_tokens);
        if (buf) c->close_buf = buf;
        char *plan = realloc(c->plan_buf, (size_t)p.max_new_tokens);
        if (plan) c->plan_buf = plan;
        if (!buf || !plan) {
            rc = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "complete: out of memory");
            goto done;
        }
        c->close_cap = (size_t)p.max_new_tokens;
    }
    t.g = c->g;
    if (p.extract) {
        if (!c->g_extract) {
            grammar_options go = grammar_default_options();
            go.allow_empty = 0;
            go.single_call = 1;
            if ((rc = grammar_compile(c->tools, c->tools_len, &go, &c->g_extract))) goto done;
        }
        t.g = c->g_extract;
    }
    grammar_state_init(t.g, &t.gs);
    t.min_json = t.plan_len = closing_bytes(t.g, &t.gs, c->plan_buf, (size_t)p.max_new_tokens);
    uint64_t rng = p.seed * 0x9E3779B97F4A7C15ULL + 1;
    uint32_t generated = 0;
    /* decode shortcuts: pend holds generated tokens not yet evaluated (a forced run),
     * rows the allowed ids of a sparse-logits step; `next` the allowed set of the coming
     * step, computed once at the end of the previous one */
    const int jump = !env_is_zero("NEEDLE_JUMP_FORWARD"), sparse = !env_is_zero("NEEDLE_SPARSE_LOGITS");
    pend = malloc((size_t)p.max_new_tokens * sizeof *pend);
    rows = malloc((size_t)c->vocab * sizeof *rows);
    if (!pend || !rows) {
        rc = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "complete: out of memory");
        goto done;
    }
    uint32_t n_pend = 0, next_allowed = 0;
    int have_next = 0;
    int32_t next_forced = -1;
    double t1 = util_clock_ms();
    while (t.phase != PH_DONE) {
        if (generated >= (uint32_t)p.max_new_tokens ||
            needle_session_position(s) + n_pend >= n_ctx) {
            e.error = generated >= (uint32_t)p.max_new_tokens
                          ? "generation reached max_new_tokens before the call was complete"
                          : "the conversation filled the context";
            e.error_code = generated >= (uint32_t)p.max_new_tokens ? "max_tokens" : "context_full";
            break;
        }
        int32_t forced = next_forced;
        t.left = (uint32_t)p.max_new_tokens - generated;
        uint32_t n_allowed = have_next ? next_allowed
                                       : allowed_tokens(s, &t, p.max_think_tokens, &forced);
        have_next = 0;
        int32_t tok = forced;
        if (n_allowed == 0) {
            e.error = "the grammar admits no token here";
            e.error_code = "internal";
            break;
        }
        const double t_pick = util_clock_ms();
        if (t.phase == PH_JSON && tok < 0 && t.closing) {
            /* follow the verified ending */
            tok = closing_token(s, c->allowed, c->plan_buf + t.plan_pos, t.plan_len - t.plan_pos);
        } else if (t.phase == PH_JSON && tok < 0) {
            tok = session_pick_token(needle_session_logits(s), c->allowed, c->vocab,
                                     p.temperature, &rng);
            size_t ending = 0;
            if (tok != c->id_end_call) {
                if (fits_budget(s, &t, tok, t.left, &ending)) {
                    /* the ending found after tok becomes the plan to fall back on */
                    char *swap = c->plan_buf;
                    c->plan_buf = c->close_buf;
                    c->close_buf = swap;
                    t.plan_len = ending;
                    t.plan_pos = 0;
                } else {
                    /* tok would leave too few tokens to finish: take the verified ending,
                     * which fits by construction, from here on */
                    t.closing = 1;
                    tok = closing_token(s, c->allowed, c->plan_buf + t.plan_pos,
                                        t.plan_len - t.plan_pos);
                }
            }
        }
        if (t.phase == PH_JSON) /* the budget walks */
            session_stats(s)->grammar_ms += util_clock_ms() - t_pick;
        if (tok < 0)
            tok = session_pick_token(needle_session_logits(s), c->allowed, c->vocab,
                                     p.temperature, &rng);
        if (t.phase == PH_JSON && t.closing && tok != c->id_end_call) {
            const char *b;
            size_t n = 0;
            tokenizer_token_bytes(c->tok, tok, &b, &n);
            if (n <= t.plan_len - t.plan_pos && !memcmp(b, c->plan_buf + t.plan_pos, n)) {
                t.plan_pos += n;
            } else {
                /* Off the verified ending: none fitted the budget (the plan is empty), or
                 * a forced token covered more than what was left of it. The plan no
                 * longer describes the grammar state, so drop it; the turn goes on like
                 * any other and ends at max_new_tokens if nothing fits. */
                t.closing = 0;
                t.plan_len = t.plan_pos = 0;
            }
        }
        advance(s, &t, tok);
        generated++;
        session_stats(s)->decode_steps++;
        /* the next step's allowed set, here once: a forced next token (one allowed)
         * needs no logits, and with jump-forward joins a run evaluated as one chunk when
         * the next choice comes (or the turn ends) */
        int need_logits = 0;
        next_forced = -1;
        if (t.phase != PH_DONE) {
            t.left = (uint32_t)p.max_new_tokens - generated;
            next_allowed = allowed_tokens(s, &t, p.max_think_tokens, &next_forced);
            have_next = 1;
            need_logits = next_forced < 0;
        }
        pend[n_pend++] = tok;
        if (!jump || need_logits || t.phase == PH_DONE ||
            generated >= (uint32_t)p.max_new_tokens) {
            rc = run_pending(s, pend, n_pend, need_logits, sparse ? next_allowed : c->vocab, rows);
            n_pend = 0;
            if (rc) break;
        }
    }
    /* a run cut short by the budget or the context: evaluate it, as single steps would
     * have (the failed turn is rolled back anyway) */
    if (n_pend && rc == NEEDLE_OK) rc = run_pending(s, pend, n_pend, 0, c->vocab, rows);
    double t_decode = util_clock_ms() - t1;
    e.decode_tps = t_decode > 0 ? generated / (t_decode / 1e3) : 0;

    if (rc == NEEDLE_OK && t.reasoning_ids.len) {
        size_t n = t.reasoning_ids.len / sizeof(int32_t), rlen = 0;
        int32_t *rids = (int32_t *)(void *)t.reasoning_ids.data;
        tokenizer_decode(c->tok, rids, n, NULL, 0, &rlen);
        reasoning = malloc(rlen + 1);
        if (reasoning &&
            tokenizer_decode(c->tok, rids, n, reasoning, rlen + 1, &rlen) == NEEDLE_OK) {
            /* the training data strips the reasoning; drop the template's newlines */
            char *r = reasoning;
            while (*r == '\n' || *r == ' ') r++;
            size_t l = strlen(r);
            while (l && (r[l - 1] == '\n' || r[l - 1] == ' ')) r[--l] = 0;
            memmove(reasoning, r, l + 1);
            e.reasoning = reasoning;
        }
    }
    if (rc == NEEDLE_OK && !e.error_code) {
        e.success = 1;
        e.calls_json = t.calls.data ? t.calls.data : "[]";
        int has_calls = t.calls.len > 2;
        c->last_turn_called = has_calls;
        e.type = is_result && !has_calls ? "respond" : "call";
    }
    if (rc) goto done;
write:
    e.peak_ram_mb = envelope_peak_ram_mb();
    rc = envelope_write(&e, out, cap, len);
done:
    /* a turn that failed in any way, reported in the envelope or by the status, is not
     * part of the conversation */
    if (saved && (rc != NEEDLE_OK || !e.success)) roll_back(s, c, last_turn_called, rc);
    free(reasoning);
    free(pend);
    free(rows);
    free(t.reasoning_ids.data);
    free(t.calls.data);
    return rc;
}
