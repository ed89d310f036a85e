/* The token budget's planner (see budget.h). */
#include "agent/budget.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

int budget_reserve(budget_plan *b, size_t max_new_tokens) {
    if (b->cap >= max_new_tokens) return NEEDLE_OK;
    char *plan = realloc(b->plan, max_new_tokens);
    if (plan) b->plan = plan;
    char *scratch = realloc(b->scratch, max_new_tokens);
    if (scratch) b->scratch = scratch;
    if (!plan || !scratch) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "complete: out of memory");
    b->cap = max_new_tokens;
    return NEEDLE_OK;
}

void budget_free(budget_plan *b) {
    free(b->plan);
    free(b->scratch);
    memset(b, 0, sizeof *b);
}

/* Bytes that end the array from `from`, if they fit in cap: their length, else 0. */
static size_t closing_bytes(const grammar *g, const grammar_state *from, char *out, size_t cap) {
    size_t n = 0;
    return grammar_complete(g, from, out, cap, &n) == NEEDLE_OK ? n : 0;
}

void budget_start(budget_plan *b, const grammar *g, const grammar_state *gs,
                  size_t max_new_tokens) {
    b->min_json = b->plan_len = closing_bytes(g, gs, b->plan, max_new_tokens);
    b->plan_pos = 0;
    b->closing = b->ended = 0;
}

int32_t budget_closing_token(const budget_plan *b, const tokenizer *tok, const uint8_t *allowed,
                             uint32_t vocab) {
    const char *close = b->plan + b->plan_pos;
    const size_t n_close = b->plan_len - b->plan_pos;
    int32_t best = -1;
    size_t best_len = 0;
    for (uint32_t v = 0; v < vocab; v++) {
        if (!allowed[v]) continue;
        const char *bytes;
        size_t n;
        if (tokenizer_token_bytes(tok, (int32_t)v, &bytes, &n) != NEEDLE_OK) continue;
        if (n > best_len && n <= n_close && !memcmp(bytes, close, n)) {
            best = (int32_t)v;
            best_len = n;
        }
    }
    return best;
}

/* Whether, after `token`, a valid ending still fits: `left` tokens remain including it,
 * and the two closing markers follow the array. On success the ending found is in
 * b->scratch, *len bytes (0 when token completes the array). */
static int fits(budget_plan *b, const grammar *g, const grammar_state *gs, const tokenizer *tok,
                int32_t token, uint32_t left, size_t *len) {
    *len = 0;
    if (left < 3) return 0;
    const char *bytes;
    size_t n;
    if (tokenizer_token_bytes(tok, token, &bytes, &n) != NEEDLE_OK) return 0;
    grammar_state_copy(&b->probe, gs);
    if (!grammar_accept_bytes(g, &b->probe, bytes, n)) return 0;
    if (grammar_is_complete(g, &b->probe)) return 1;
    *len = left > 3 ? closing_bytes(g, &b->probe, b->scratch, left - 3) : 0;
    return *len > 0;
}

int32_t budget_check(budget_plan *b, const grammar *g, const grammar_state *gs,
                     const tokenizer *tok, const uint8_t *allowed, uint32_t vocab,
                     int32_t picked, uint32_t left) {
    size_t ending = 0;
    if (fits(b, g, gs, tok, picked, left, &ending)) {
        /* the ending found after picked becomes the plan to fall back on */
        char *swap = b->plan;
        b->plan = b->scratch;
        b->scratch = swap;
        b->plan_len = ending;
        b->plan_pos = 0;
        return picked;
    }
    /* picked would leave too few tokens to finish: the plan fits by construction */
    b->closing = b->ended = 1;
    return budget_closing_token(b, tok, allowed, vocab);
}

void budget_follow(budget_plan *b, const tokenizer *tok, int32_t token) {
    const char *bytes = "";
    size_t n = 0;
    tokenizer_token_bytes(tok, token, &bytes, &n);
    if (n <= b->plan_len - b->plan_pos && !memcmp(bytes, b->plan + b->plan_pos, n)) {
        b->plan_pos += n;
        return;
    }
    b->closing = 0;
    b->plan_len = b->plan_pos = 0;
}
