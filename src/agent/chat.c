/* Conversations with tools: the constrained decode of one assistant turn and the envelope
 * (spec §7-8); the prompt template they render is agent/prompt.h's.
 *
 * Decoding is a small state machine: optional "▁", then either <think> (free text up to
 * max_think_tokens, then </think> and "\n" forced) or <tool_call>; then the call array,
 * constrained byte by byte by the grammar compiled from the schemas; then </tool_call> and
 * <|im_end|> forced. Forced tokens skip the logits (no choice to make). A turn runs as
 * named steps (chat_complete): begin (retrieve, render, encode, checkpoint, prefill),
 * decode, envelope, end; the token budget's planner is agent/budget.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/chat.h"
#include "agent/budget.h"
#include "agent/confidence.h"
#include "agent/retrieval.h"
#include "agent/envelope.h"
#include "agent/prompt.h"
#include "agent/repeat_guard.h"
#include "grammar/grammar.h"
#include "grammar/json_canon.h"
#include "model/session.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/strbuf.h"
#include "util/struct_size.h"


#define CHAT_MAX_RENDERED 64u /* top_k limit */

static const char *const MARKER_TEXT[] = {"<think>", "</think>", "<tool_call>", "</tool_call>",
                                          "<|im_end|>", "<|im_start|>"};

struct chat {
    chat_env *env;      /* the session parts the conversation runs on (chat.h) */
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
    uint32_t prefix_len;  /* the session's base (session_reset) is the prefix end */
    int last_turn_called; /* the previous envelope was a "call" with calls */
    session_checkpoint turn_start; /* the conversation before the current turn */
    uint8_t *allowed;     /* [vocab] */
    budget_plan budget;   /* the token budget's planner (agent/budget.h) */
    confidence_state conf; /* the envelope's confidence (agent/confidence.h) */
    char *system;          /* the system facts, for re-rendering the prefix */
    /* retrieval (agent/retrieval.h): every tool's embedding, and which are rendered */
    int retrieval;
    uint32_t top_k;
    tool_index index;
    int rendered_valid;
    uint32_t rendered[CHAT_MAX_RENDERED], n_rendered;
    char *rendered_names;  /* JSON array of the rendered tools' names */
};

void chat_on_reset(struct chat *c) {
    if (!c) return;
    c->last_turn_called = 0;
    confidence_on_reset(&c->conf);
}

const session_cells *chat_cells(const struct chat *c) {
    return c ? confidence_cells(&c->conf) : NULL;
}

uint32_t chat_prefix_length(const struct chat *c) { return c ? c->prefix_len : 0; }

void chat_free(struct chat *c) {
    if (!c) return;
    grammar_free(c->g);
    grammar_free(c->g_extract);
    free(c->tools);
    grammar_trie_free(c->trie);
    free(c->allowed);
    budget_free(&c->budget);
    session_checkpoint_free(&c->turn_start);
    confidence_free(&c->conf);
    free(c->system);
    tool_index_free(&c->index);
    free(c->rendered_names);
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

needle_tools_params needle_tools_default_params(void) {
    needle_tools_params p;
    memset(&p, 0, sizeof p);
    p.size = sizeof p;
    p.retrieval_threshold = 5;
    p.top_k = 5;
    return p;
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

/* Starts the conversation over on the prefix ids[0:n]: with a sliding window the prefix is
 * pinned as attention sinks, so the tools stay visible however long the conversation
 * grows. configure_sinks starts at position 0; the end of the prefix becomes the base
 * session_reset returns to. */
static int prefill_prefix(struct chat *c, const int32_t *ids, size_t n) {
    model_session *s = c->env->core;
    const uint32_t window = session_window(s);
    int rc = session_configure_sinks(s, window ? (uint32_t)n : 0);
    if (rc) return rc;
    confidence_restart(&c->conf);
    if ((rc = session_prefill(s, ids, (uint32_t)n, 0, &c->env->cb, chat_cells(c)))) return rc;
    if ((rc = session_set_base(s))) return rc;
    confidence_pin_base(&c->conf);
    session_stats(s)->prefix_evaluations++;
    c->prefix_len = (uint32_t)n;
    c->last_turn_called = 0;
    return NEEDLE_OK;
}

/* Retrieval: renders tools chosen[0:k] instead of the current ones (the grammar follows),
 * unless they are what is rendered already. The conversation restarts on the new prefix.
 * On failure the chat has no prefix until the next query installs one. */
static int render_tools(struct chat *c, const uint32_t *chosen, uint32_t k) {
    const model_session *s = c->env->core;
    if (c->rendered_valid && k == c->n_rendered && !memcmp(chosen, c->rendered, k * sizeof *chosen))
        return NEEDLE_OK;
    char *tools = NULL, *names = NULL;
    size_t tools_len = 0, n_ids = 0;
    int32_t *ids = NULL;
    grammar *g = NULL;
    int rc = tool_index_subset(&c->index, chosen, k, &tools, &tools_len, &names);
    if (!rc) rc = prompt_compile_tools(tools, tools_len, &g);
    if (!rc) rc = prompt_prefix_ids(session_model(s), c->system, tools, tools_len, &ids, &n_ids);
    if (!rc && n_ids >= session_context_length(s))
        rc = needle_fail(NEEDLE_ERR_CONTEXT_FULL, "set_tools: the system and tools prefix is "
                         "%zu tokens, the context holds %u", n_ids, session_context_length(s));
    if (!rc) {
        c->rendered_valid = 0;
        rc = prefill_prefix(c, ids, n_ids);
    }
    if (!rc) {
        grammar_free(c->g);
        grammar_free(c->g_extract);
        c->g_extract = NULL;
        c->g = g;
        g = NULL;
        free(c->tools);
        c->tools = tools;
        c->tools_len = tools_len;
        tools = NULL;
        free(c->rendered_names);
        c->rendered_names = names;
        names = NULL;
        memcpy(c->rendered, chosen, k * sizeof *chosen);
        c->n_rendered = k;
        c->rendered_valid = 1;
    }
    grammar_free(g);
    free(tools);
    free(names);
    free(ids);
    return rc;
}

int chat_create(chat_env *env, const char *system, const char *tools_json,
                const needle_tools_params *params, struct chat **slot) {
    if (!tools_json) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "set_tools: NULL argument");
    model_session *s = env->core;
    needle_tools_params tp = needle_tools_default_params();
    int rc = struct_size_in(&tp, params, sizeof tp, "set_tools: needle_tools_params");
    if (rc) return rc;
    if (tp.top_k == 0) tp.top_k = 5;
    if (tp.top_k > CHAT_MAX_RENDERED)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "set_tools: top_k %u exceeds %u",
                           tp.top_k, CHAT_MAX_RENDERED);
    const struct needle_model *m = session_model(s);
    const tokenizer *tok = model_tokenizer(m);
    const uint32_t vocab = model_vocab(m);
    if (!tok) return needle_fail(NEEDLE_ERR_NO_TOKENIZER, "set_tools: the model has no tokenizer");
    if (!system) system = "";

    struct chat *c = calloc(1, sizeof *c);
    char *tools = NULL;
    int32_t *ids = NULL;
    size_t tools_len = 0, n_ids = 0;
    if (!c) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "set_tools: out of memory");
    c->env = env;
    if ((rc = prompt_canonical_tools(tools_json, &tools, &tools_len))) goto fail;
    if ((rc = prompt_compile_tools(tools, tools_len, &c->g))) goto fail;
    c->tok = tok;
    c->vocab = vocab;
    if ((rc = build_trie(c, tok, vocab))) goto fail;

    c->id_think = tokenizer_marker_id(tok, "<think>");
    c->id_end_think = tokenizer_marker_id(tok, "</think>");
    c->id_call = tokenizer_marker_id(tok, "<tool_call>");
    c->id_end_call = tokenizer_marker_id(tok, "</tool_call>");
    c->id_im_end = tokenizer_marker_id(tok, "<|im_end|>");
    c->id_im_start = tokenizer_marker_id(tok, "<|im_start|>");
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
    if (tokenizer_encode_ex(tok, "<tool_call>", 11, 1, sp, 4, &n_sp) == NEEDLE_OK && n_sp == 2 &&
        sp[1] == c->id_call)
        c->id_space = sp[0];
    if ((rc = tokenizer_encode_ex(tok, "\n", 1, 0, c->newline, 8, &c->n_newline))) goto fail;
    c->allowed = malloc(vocab);
    c->system = strdup(system);
    if (!c->allowed || !c->system) {
        rc = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "set_tools: out of memory");
        goto fail;
    }

    /* retrieval: more tools than the threshold and a model that can embed them. Until
     * the first query chooses, the first top_k tools are rendered. */
    const uint32_t n_tools = grammar_tool_count(c->g);
    c->retrieval = n_tools > tp.retrieval_threshold &&
                   model_probe_head(m, HEAD_CODE_CONTRASTIVE) != NULL;
    c->top_k = tp.top_k < n_tools ? tp.top_k : n_tools;
    if (c->retrieval) {
        char *canon = malloc(tools_len + 1);
        if (!canon) {
            rc = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "set_tools: out of memory");
            goto fail;
        }
        memcpy(canon, tools, tools_len + 1);
        if ((rc = tool_index_build(&c->index, s, &env->embedder, canon, tools_len,
                                   tp.tool_index_path)))
            goto fail;
    }
    c->tools = tools;
    c->tools_len = tools_len;
    tools = NULL;

    /* The previous tools' conversation ends here. (Rewinding it instead would restore
     * its prefix position, so the new prefix would be appended after the old one.) */
    chat_free(*slot);
    *slot = NULL;
    if ((rc = confidence_attach(&c->conf, m, c->env->cells_tap))) goto fail;
    if (c->retrieval) {
        uint32_t first[CHAT_MAX_RENDERED];
        for (uint32_t i = 0; i < c->top_k; i++) first[i] = i;
        rc = render_tools(c, first, c->top_k);
    } else {
        rc = prompt_prefix_ids(m, system, c->tools, c->tools_len, &ids, &n_ids);
        if (!rc && n_ids >= session_context_length(s))
            rc = needle_fail(NEEDLE_ERR_CONTEXT_FULL, "set_tools: the system and tools prefix "
                             "is %zu tokens, the context holds %u", n_ids,
                             session_context_length(s));
        if (!rc) rc = prefill_prefix(c, ids, n_ids);
    }
    if (rc) goto fail;
    *slot = c;
    free(ids);
    needle_clear_error();
    return NEEDLE_OK;

fail:
    chat_free(c);
    free(tools);
    free(ids);
    return rc;
}

enum phase { PH_START, PH_AFTER_SPACE, PH_THINK, PH_NEWLINE, PH_CALL_OPEN, PH_JSON, PH_CLOSE,
             PH_END, PH_DONE };

/* One assistant turn of needle_session_complete, from its request to its envelope. */
typedef struct turn {
    needle_complete_params p; /* the caller's, defaults filled in */
    const char *text;
    int is_result;        /* the text is a tool result (else a query) */
    int last_turn_called; /* the conversation's, before this turn (a roll back restores it) */
    int saved;            /* chat.turn_start holds this turn's starting point */
    /* decoding */
    const grammar *g;
    enum phase phase;
    uint32_t generated;
    uint32_t left;        /* tokens left in the budget, this one included */
    uint32_t think_tokens, newline_index;
    int guard;            /* the repetition guard is on (needle_complete_params.repeat_guard) */
    repeat_guard rg;
    grammar_state gs;
    uint64_t rng;
    int32_t *pend;        /* generated tokens not yet evaluated (a forced run) */
    uint32_t n_pend;
    int32_t *rows;        /* [vocab] the allowed ids of a sparse-logits step */
    strbuf reasoning_ids; /* int32 ids of the reasoning, as bytes */
    strbuf calls;         /* the call array text */
    /* the answer */
    envelope e;
    char *reasoning;
    int suppressed;       /* a low-confidence answer: reported, then rolled back */
} turn;

/* Fills c->allowed for the current phase; returns the number of allowed tokens and the
 * single forced token in *forced when there is exactly one. */
static uint32_t allowed_tokens(struct chat *c, turn *t, int32_t *forced) {
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
        if (t->think_tokens >= t->p.max_think_tokens ||
            t->left <= c->budget.min_json + c->n_newline + 4) {
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
        /* a string caught repeating itself ends here, and the array after its call (the
         * verified ending, when the budget already follows it, ends them anyway) */
        if (t->guard && (t->rg.fired || t->rg.closes) && !c->budget.closing)
            n = repeat_guard_restrict(&t->rg, t->g, &t->gs, c->tok, a, V, n, c->budget.scratch,
                                      c->budget.cap);
        session_stats(c->env->core)->grammar_ms += util_clock_ms() - t0;
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

static void advance(struct chat *c, turn *t, int32_t tok) {
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
            const uint32_t closes = t->rg.closes;
            if (t->guard) repeat_guard_accept(&t->rg, t->g, &t->gs, tok, b, n);
            else grammar_accept_bytes(t->g, &t->gs, b, n);
            strbuf_put(&t->calls, b, n);
            session_stats(c->env->core)->repeat_guard_closes += t->rg.closes - closes;
        }
        break;
    case PH_CLOSE: t->phase = PH_DONE; break;
    default: break;
    }
}

/* Reports a token chosen in `phase` to the session's token callback: reasoning text and
 * call-array bytes; the markers around them are not output. */
static int stream_piece(const struct chat *c, enum phase phase, int32_t tok) {
    int32_t kind;
    if (phase == PH_THINK && tok != c->id_end_think) kind = NEEDLE_PIECE_REASONING;
    else if (phase == PH_JSON && tok != c->id_end_call) kind = NEEDLE_PIECE_CALLS;
    else return NEEDLE_OK;
    const char *b;
    size_t n;
    if (tokenizer_token_bytes(c->tok, tok, &b, &n) != NEEDLE_OK) return NEEDLE_OK;
    return session_emit(&c->env->cb, kind, tok, b, n);
}

/* Renders the turn text that precedes the assistant's answer (agent/prompt.h). */
static int render_turn(const struct chat *c, const char *text, int is_result, strbuf *out) {
    const prompt_turn kind = is_result ? PROMPT_TOOL_RESULT
                             : session_position(c->env->core) == c->prefix_len ? PROMPT_FIRST_QUERY
                                                                                : PROMPT_QUERY;
    return prompt_render_turn(out, text, kind);
}

/* After a failed turn: the conversation as it was before it (turn_start covers every
 * position a turn can add; the prefix is only the fallback should that ever fail). A hard
 * error's message (rc) survives the fallback's. */
static void roll_back(struct chat *c, int last_turn_called, int rc) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", needle_last_error());
    if (session_checkpoint_restore(c->env->core, &c->turn_start) == NEEDLE_OK) {
        c->last_turn_called = last_turn_called;
        confidence_turn_abort(&c->conf);
        return;
    }
    session_reset(c->env->core);
    chat_on_reset(c);
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

/* The tests' stand-in preferences (chat_env.logits_hook) on logits a run just computed. */
static void apply_logits_hook(const struct chat *c, const int32_t *tokens, uint32_t n) {
    float *logits = session_logits_mut(c->env->core);
    if (c->env->logits_hook && logits)
        c->env->logits_hook(c->env->logits_hook_user, tokens, n, logits, c->vocab);
}

/* Evaluates the generated tokens pend[0..n); with need_logits, the logits for the next
 * pick: only the allowed ids' when there are at most vocab/4 of them (n_allowed; pass the
 * vocabulary size to always take all) in at most SPARSE_RUNS_MAX runs of consecutive
 * ids. rows: [vocab] scratch. */
static int run_pending(const struct chat *c, const int32_t *pend, uint32_t n, int need_logits,
                       uint32_t n_allowed, int32_t *rows) {
    model_session *s = c->env->core;
    int rc = -1;
    if (need_logits && n_allowed <= c->vocab / 4) {
        uint32_t k = 0, runs = 0;
        for (uint32_t v = 0; v < c->vocab; v++)
            if (c->allowed[v]) {
                runs += k == 0 || rows[k - 1] != (int32_t)v - 1;
                rows[k++] = (int32_t)v;
            }
        /* scattered ids cost a product per run of consecutive ids: then all of them */
        if (runs <= SPARSE_RUNS_MAX) rc = session_run_rows(s, pend, n, rows, k, chat_cells(c));
    }
    if (rc < 0) rc = session_run(s, pend, n, NULL, need_logits, chat_cells(c));
    if (rc == NEEDLE_OK && need_logits) apply_logits_hook(c, pend, n);
    return rc;
}

/* ---- the turn's steps: begin, decode, envelope, end ----------------------------------- */

/* The request: params (NULL: defaults) checked and their zeros filled in, the envelope's
 * fields known before anything runs. Nothing is held yet, so a failure needs no end. */
static int turn_init(struct chat *c, turn *t, const char *text,
                     const needle_complete_params *params) {
    memset(t, 0, sizeof *t);
    t->p = needle_complete_default_params();
    int rc = struct_size_in(&t->p, params, sizeof t->p, "complete: needle_complete_params");
    if (rc) return rc;
    if (t->p.max_new_tokens <= 0) t->p.max_new_tokens = 256;
    if (t->p.max_think_tokens == 0) t->p.max_think_tokens = 64;
    if (!(t->p.temperature >= 0.0f) || !isfinite(t->p.temperature))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "complete: temperature must be >= 0");
    if (!(t->p.min_confidence >= 0.0f) || !isfinite(t->p.min_confidence))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "complete: min_confidence must be >= 0");
    t->text = text;
    t->is_result = t->p.turn == NEEDLE_TURN_TOOL_RESULT ||
                   (t->p.turn == NEEDLE_TURN_AUTO && c->last_turn_called);
    t->last_turn_called = c->last_turn_called;
    t->e = (envelope){.type = t->is_result ? "respond" : "call", .calls_json = "[]",
                      .reasoning = "", .tools_json = c->tools, .system = c->system,
                      .text = text, .is_query = !t->is_result};
    return NEEDLE_OK;
}

/* Retrieval: a query that starts a conversation chooses the tools it sees. */
static int turn_retrieve(struct chat *c, turn *t) {
    int rc = NEEDLE_OK;
    if (c->retrieval && !t->is_result &&
        (!c->rendered_valid || session_position(c->env->core) == c->prefix_len)) {
        uint32_t chosen[CHAT_MAX_RENDERED];
        rc = tool_index_select(&c->index, c->env->core, &c->env->embedder, t->text, c->top_k,
                               chosen);
        if (rc == NEEDLE_OK) rc = render_tools(c, chosen, c->top_k);
    }
    if (c->retrieval && c->rendered_valid) t->e.retrieved_tools = c->rendered_names;
    return rc;
}

/* Renders and encodes the turn's text into *ids; text that is not UTF-8 and a turn that
 * does not fit are answered by the envelope (t->e.error_code), not by the status. */
static int turn_encode(struct chat *c, turn *t, int32_t **ids, size_t *n_ids) {
    strbuf chunk = {0};
    int rc = render_turn(c, t->text, t->is_result, &chunk);
    if (rc == NEEDLE_OK) rc = prompt_encode_alloc(c->tok, chunk.data, chunk.len, 0, ids, n_ids);
    free(chunk.data);
    if (rc == NEEDLE_ERR_INVALID_UTF8) {
        t->e.error = needle_last_error();
        t->e.error_code = "invalid_input";
        return NEEDLE_OK;
    }
    if (rc) return rc;
    const model_session *s = c->env->core;
    if (*n_ids + 4 > session_context_length(s) - session_position(s)) {
        t->e.error = "the conversation does not fit in the context; reset the session";
        t->e.error_code = "context_full";
        return NEEDLE_OK;
    }
    /* With a sliding window (the positions seen past the pinned prefix) the context is
     * unbounded, but a turn longer than the window loses its own start before the answer
     * begins: the envelope says so ("input_truncated"), never a silent success (issue 31). */
    const uint32_t window = session_window(s);
    if (window && *n_ids + 4 > window) {
        t->e.truncated_tokens = (uint32_t)*n_ids;
        t->e.truncated_window = window;
    }
    return NEEDLE_OK;
}

/* begin: retrieve, render, encode, checkpoint (what a failed turn returns to), prefill. */
static int turn_begin(struct chat *c, turn *t) {
    model_session *s = c->env->core;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = turn_retrieve(c, t);
    if (rc == NEEDLE_OK) rc = turn_encode(c, t, &ids, &n_ids);
    /* the turn evaluates its n_ids tokens and at most max_new_tokens more */
    if (rc == NEEDLE_OK && !t->e.error_code)
        rc = session_checkpoint_save(s, &c->turn_start,
                                     (uint32_t)n_ids + (uint32_t)t->p.max_new_tokens);
    if (rc == NEEDLE_OK && !t->e.error_code) {
        t->saved = 1;
        confidence_turn_begin(&c->conf);
        const double t0 = util_clock_ms();
        rc = session_prefill(s, ids, (uint32_t)n_ids, 1, &c->env->cb, chat_cells(c));
        if (rc == NEEDLE_OK) apply_logits_hook(c, ids, (uint32_t)n_ids);
        const double ms = util_clock_ms() - t0;
        t->e.prefill_tps = ms > 0 ? n_ids / (ms / 1e3) : 0;
    }
    free(ids);
    return rc;
}

/* The decoder's state for the turn: the grammar (one call under extract), the budget's
 * first plan, the guards, the buffers of the decode shortcuts. */
static int decode_setup(struct chat *c, turn *t) {
    int rc = budget_reserve(&c->budget, (size_t)t->p.max_new_tokens);
    if (rc) return rc;
    t->g = c->g;
    if (t->p.extract) {
        if (!c->g_extract) {
            grammar_options go = grammar_default_options();
            go.allow_empty = 0;
            go.single_call = 1;
            if ((rc = grammar_compile(c->tools, c->tools_len, &go, &c->g_extract))) return rc;
        }
        t->g = c->g_extract;
    }
    grammar_state_init(t->g, &t->gs);
    budget_start(&c->budget, t->g, &t->gs, (size_t)t->p.max_new_tokens);
    t->guard = t->p.repeat_guard > 0 ||
               (t->p.repeat_guard == 0 && !env_is_zero("NEEDLE_REPEAT_GUARD"));
    t->rng = t->p.seed * 0x9E3779B97F4A7C15ULL + 1;
    t->pend = malloc((size_t)t->p.max_new_tokens * sizeof *t->pend);
    t->rows = malloc((size_t)c->vocab * sizeof *t->rows);
    if (!t->pend || !t->rows) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "complete: out of memory");
    return NEEDLE_OK;
}

/* The token of this step: forced, or picked from the logits among the allowed ids; in
 * the call array the budget planner (agent/budget.h) may override the pick, and each
 * free choice counts toward the confidence. */
static int32_t choose_token(struct chat *c, turn *t, int32_t forced) {
    model_session *s = c->env->core;
    budget_plan *b = &c->budget;
    const double t_pick = util_clock_ms();
    int32_t tok = forced;
    if (t->phase == PH_JSON && tok < 0 && b->closing) {
        tok = budget_closing_token(b, c->tok, c->allowed, c->vocab); /* follow the plan */
    } else if (t->phase == PH_JSON && tok < 0) {
        tok = session_pick_token(session_logits(s), c->allowed, c->vocab, t->p.temperature,
                                 &t->rng);
        if (tok != c->id_end_call)
            tok = budget_check(b, t->g, &t->gs, c->tok, c->allowed, c->vocab, tok, t->left);
        if (!b->closing)
            confidence_add_choice(&c->conf, session_logits(s), c->allowed, c->vocab, tok);
    }
    if (t->phase == PH_JSON) /* the budget walks */
        session_stats(s)->grammar_ms += util_clock_ms() - t_pick;
    if (tok < 0)
        tok = session_pick_token(session_logits(s), c->allowed, c->vocab, t->p.temperature,
                                 &t->rng);
    if (t->phase == PH_JSON && b->closing && tok != c->id_end_call) budget_follow(b, c->tok, tok);
    return tok;
}

/* decode: token by token through the phases until <|im_end|>, the budget or the context
 * ends it. A run of forced tokens is evaluated as one chunk when the next choice comes
 * (jump-forward), a choice among few ids computes only their logits (sparse logits). */
static int turn_decode(struct chat *c, turn *t) {
    model_session *s = c->env->core;
    const uint32_t n_ctx = session_context_length(s), max_new = (uint32_t)t->p.max_new_tokens;
    const int jump = !env_is_zero("NEEDLE_JUMP_FORWARD"), sparse = !env_is_zero("NEEDLE_SPARSE_LOGITS");
    int rc = decode_setup(c, t);
    if (rc) return rc;
    uint32_t next_allowed = 0;
    int have_next = 0; /* the allowed set of the coming step, computed at the previous one */
    int32_t next_forced = -1;
    const double t0 = util_clock_ms();
    while (rc == NEEDLE_OK && t->phase != PH_DONE) {
        if (t->generated >= max_new || session_position(s) + t->n_pend >= n_ctx) {
            t->e.error = t->generated >= max_new
                             ? "generation reached max_new_tokens before the call was complete"
                             : "the conversation filled the context";
            t->e.error_code = t->generated >= max_new ? "max_tokens" : "context_full";
            break;
        }
        int32_t forced = next_forced;
        t->left = max_new - t->generated;
        const uint32_t n_allowed = have_next ? next_allowed : allowed_tokens(c, t, &forced);
        have_next = 0;
        if (n_allowed == 0) {
            t->e.error = "the grammar admits no token here";
            t->e.error_code = "internal";
            break;
        }
        const int32_t tok = choose_token(c, t, forced);
        const enum phase chosen_in = t->phase;
        advance(c, t, tok);
        t->generated++;
        if ((rc = stream_piece(c, chosen_in, tok))) break;
        session_stats(s)->decode_steps++;
        /* a forced next token (one allowed) needs no logits, and with jump-forward joins
         * a run evaluated as one chunk when the next choice comes (or the turn ends) */
        int need_logits = 0;
        next_forced = -1;
        if (t->phase != PH_DONE) {
            t->left = max_new - t->generated;
            next_allowed = allowed_tokens(c, t, &next_forced);
            have_next = 1;
            need_logits = next_forced < 0;
        }
        t->pend[t->n_pend++] = tok;
        if (!jump || need_logits || t->phase == PH_DONE || t->generated >= max_new) {
            rc = run_pending(c, t->pend, t->n_pend, need_logits,
                             sparse ? next_allowed : c->vocab, t->rows);
            t->n_pend = 0;
        }
    }
    /* a run cut short by the budget or the context: evaluate it, as single steps would
     * have (the failed turn is rolled back anyway) */
    if (t->n_pend && rc == NEEDLE_OK) rc = run_pending(c, t->pend, t->n_pend, 0, c->vocab, t->rows);
    if (c->budget.ended || t->generated >= max_new) session_stats(s)->budget_endings++;
    const double ms = util_clock_ms() - t0;
    t->e.decode_tps = ms > 0 ? t->generated / (ms / 1e3) : 0;
    return rc;
}

/* The reasoning as text, without the template's newlines (the training data strips it). */
static void turn_reasoning(struct chat *c, turn *t) {
    if (!t->reasoning_ids.len) return;
    size_t n = t->reasoning_ids.len / sizeof(int32_t), rlen = 0;
    int32_t *rids = (int32_t *)(void *)t->reasoning_ids.data;
    tokenizer_decode(c->tok, rids, n, NULL, 0, &rlen);
    t->reasoning = malloc(rlen + 1);
    if (!t->reasoning ||
        tokenizer_decode(c->tok, rids, n, t->reasoning, rlen + 1, &rlen) != NEEDLE_OK)
        return;
    char *r = t->reasoning;
    while (*r == '\n' || *r == ' ') r++;
    size_t l = strlen(r);
    while (l && (r[l - 1] == '\n' || r[l - 1] == ' ')) r[--l] = 0;
    memmove(t->reasoning, r, l + 1);
    t->e.reasoning = t->reasoning;
}

/* envelope: the answer (its calls, reasoning and confidence; below min_confidence the
 * calls are shown apart, not to be executed) or the error the turn ran into, written. */
static int turn_envelope(struct chat *c, turn *t, char *out, size_t cap, size_t *len) {
    envelope *e = &t->e;
    turn_reasoning(c, t);
    if (!e->error_code) {
        e->success = 1;
        e->calls_json = t->calls.data ? t->calls.data : "[]";
        const int has_calls = t->calls.len > 2;
        c->last_turn_called = has_calls;
        e->type = t->is_result && !has_calls ? "respond" : "call";
        e->has_confidence = 1;
        e->confidence = confidence_value(&c->conf, session_stats(c->env->core));
        if (has_calls && e->confidence < t->p.min_confidence) {
            e->type = "low_confidence";
            e->suppressed_calls = e->calls_json;
            e->calls_json = "[]";
            t->suppressed = 1;
        }
    }
    e->peak_ram_mb = envelope_peak_ram_mb();
    return envelope_write(e, out, cap, len);
}

/* end: a turn that failed in any way, reported in the envelope or by the status, or
 * whose calls were suppressed, is not part of the conversation. */
static void turn_end(struct chat *c, turn *t, int rc) {
    if (t->saved && (rc != NEEDLE_OK || !t->e.success || t->suppressed))
        roll_back(c, t->last_turn_called, rc);
    free(t->reasoning);
    free(t->pend);
    free(t->rows);
    free(t->reasoning_ids.data);
    free(t->calls.data);
}

int chat_complete(struct chat *c, const char *text, const needle_complete_params *params,
                  char *out, size_t cap, size_t *len) {
    if (!text || !len || (!out && cap))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "complete: NULL argument");
    turn t;
    int rc = turn_init(c, &t, text, params);
    if (rc) return rc;
    rc = turn_begin(c, &t);
    if (rc == NEEDLE_OK && !t.e.error_code) rc = turn_decode(c, &t);
    if (rc == NEEDLE_OK) rc = turn_envelope(c, &t, out, cap, len);
    turn_end(c, &t, rc);
    return rc;
}

int chat_append_turn(struct chat *c, const char *text, int32_t turn_kind,
                     const char *calls_json) {
    if (!text || !calls_json)
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "append_turn: NULL argument");
    model_session *s = c->env->core;
    char *calls = NULL;
    size_t calls_len = 0;
    int rc = grammar_json_canon(calls_json, strlen(calls_json), &calls, &calls_len);
    if (rc) return rc;
    if (calls_len < 2 || calls[0] != '[') {
        free(calls);
        return needle_fail(NEEDLE_ERR_JSON, "append_turn: the calls must be a JSON array");
    }
    const int is_result = turn_kind == NEEDLE_TURN_TOOL_RESULT ||
                          (turn_kind == NEEDLE_TURN_AUTO && c->last_turn_called);
    strbuf chunk = {0};
    int32_t *turn_ids = NULL, *call_ids = NULL, *ids = NULL;
    size_t n_turn = 0, n_call = 0, n = 0;
    rc = render_turn(c, text, is_result, &chunk);
    if (rc == NEEDLE_OK) rc = prompt_encode_alloc(c->tok, chunk.data, chunk.len, 0, &turn_ids, &n_turn);
    if (rc == NEEDLE_OK) rc = prompt_encode_alloc(c->tok, calls, calls_len, 0, &call_ids, &n_call);
    if (rc == NEEDLE_OK && !(ids = malloc((n_turn + n_call + 4) * sizeof *ids)))
        rc = needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "append_turn: out of memory");
    if (rc == NEEDLE_OK) {
        /* the answer as complete() leaves it: "▁<tool_call>" CALLS "</tool_call><|im_end|>" */
        memcpy(ids, turn_ids, n_turn * sizeof *ids);
        n = n_turn;
        if (c->id_space >= 0) ids[n++] = c->id_space;
        ids[n++] = c->id_call;
        memcpy(ids + n, call_ids, n_call * sizeof *ids);
        n += n_call;
        ids[n++] = c->id_end_call;
        ids[n++] = c->id_im_end;
        if (n > session_context_length(s) - session_position(s))
            rc = needle_fail(NEEDLE_ERR_CONTEXT_FULL, "append_turn: %zu tokens do not fit: "
                             "position %u of a %u-position context", n,
                             session_position(s), session_context_length(s));
    }
    if (rc == NEEDLE_OK) rc = session_checkpoint_save(s, &c->turn_start, (uint32_t)n);
    if (rc == NEEDLE_OK) {
        const int last_turn_called = c->last_turn_called;
        if ((rc = session_prefill(s, ids, (uint32_t)n, 0, &c->env->cb, chat_cells(c))))
            roll_back(c, last_turn_called, rc);
        else c->last_turn_called = calls_len > 2;
    }
    free(chunk.data);
    free(turn_ids);
    free(call_ids);
    free(ids);
    free(calls);
    if (rc == NEEDLE_OK) needle_clear_error();
    return rc;
}
