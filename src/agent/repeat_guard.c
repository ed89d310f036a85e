/* The repetition guard (repeat_guard.h): a detector over the tokens of one string value,
 * and the grammar side that follows values and finds the tokens that end one. */
#include "agent/repeat_guard.h"

#include <string.h>

#include "util/error.h"

void repeat_guard_reset(repeat_guard *rg) { memset(rg, 0, sizeof *rg); }

/* Stops following a string (and starts on the one at `depth`, if not 0); the decode's
 * count of cut strings stays. */
static void follow(repeat_guard *rg, uint32_t depth) {
    const uint32_t closes = rg->closes;
    repeat_guard_reset(rg);
    rg->closes = closes;
    rg->depth = depth;
}

int repeat_guard_push(repeat_guard *rg, int32_t tok) {
    const uint32_t P = REPEAT_GUARD_MAX_PERIOD;
    for (uint32_t p = 1; p <= P; p++) {
        /* recent[(count - p) % P] is still the token p places back: the slot written
         * below held the one P places back */
        if (rg->count >= p && rg->recent[(rg->count - p) % P] == tok) rg->run[p - 1]++;
        else rg->run[p - 1] = 0;
        /* a tail periodic with period p over run + p tokens: the first p tokens of the
         * cycle, then run tokens that repeat it */
        if (rg->run[p - 1] + p >= REPEAT_GUARD_MIN_TOKENS && !rg->fired) {
            rg->fired = 1;
            rg->closes++;
        }
    }
    rg->recent[rg->count % P] = tok;
    rg->count++;
    return rg->fired;
}

int repeat_guard_accept(repeat_guard *rg, const grammar *g, grammar_state *st, int32_t tok,
                        const char *bytes, size_t n) {
    const uint32_t d0 = grammar_string_depth(g, st);
    grammar_state tmp;
    grammar_state_copy(&tmp, st);
    int inside = d0 != 0;
    for (size_t i = 0; i < n; i++) {
        if (!grammar_accept_byte(g, &tmp, (uint8_t)bytes[i])) return 0;
        if (grammar_string_depth(g, &tmp) != d0) inside = 0;
    }
    grammar_state_copy(st, &tmp);
    if (inside && n) {
        if (rg->depth != d0) follow(rg, d0); /* not followed yet: from here on */
        repeat_guard_push(rg, tok);
    } else {
        /* the token left the string followed, or opened one: its bytes inside the new
         * string are a fragment, not counted */
        follow(rg, grammar_string_depth(g, st));
    }
    return 1;
}

/* Length of the bytes of `ending` that finish the string at `depth` from st (the byte
 * that closes it included); 0 if they do not within n bytes. */
static size_t string_ending(const grammar *g, const grammar_state *st, uint32_t depth,
                            const char *ending, size_t n) {
    grammar_state probe;
    grammar_state_copy(&probe, st);
    for (size_t i = 0; i < n; i++) {
        if (!grammar_accept_byte(g, &probe, (uint8_t)ending[i])) return 0;
        if (grammar_string_depth(g, &probe) != depth) return i + 1;
    }
    return 0;
}

/* Whether the n bytes b, read from st, start another call: a "," right after a complete
 * call. Only tokens holding a comma can; the others are not walked. */
static int starts_another_call(const grammar *g, const grammar_state *st, const char *b,
                               size_t n) {
    if (!memchr(b, ',', n)) return 0;
    grammar_state probe;
    grammar_state_copy(&probe, st);
    for (size_t i = 0; i < n; i++) {
        if (b[i] == ',' && grammar_between_calls(g, &probe)) return 1;
        if (!grammar_accept_byte(g, &probe, (uint8_t)b[i])) return 0;
    }
    return 0;
}

/* Whether token id may follow: its bytes agree with the string's ending (one is a prefix
 * of the other; n_ending = 0: no ending to agree with) and, once a value was cut, they
 * start no other call. */
static int agrees(const repeat_guard *rg, const grammar *g, const grammar_state *st,
                  const tokenizer *tok, int32_t id, const char *ending, size_t n_ending) {
    const char *b;
    size_t n;
    if (tokenizer_token_bytes(tok, id, &b, &n) != NEEDLE_OK) return 0;
    if (n == 0) return n_ending == 0; /* ends nothing, starts nothing */
    if (n_ending && memcmp(b, ending, n < n_ending ? n : n_ending)) return 0;
    return !rg->closes || !starts_another_call(g, st, b, n);
}

uint32_t repeat_guard_restrict(const repeat_guard *rg, const grammar *g, const grammar_state *st,
                               const tokenizer *tok, uint8_t *allowed, uint32_t vocab,
                               uint32_t n_allowed, char *scratch, size_t cap) {
    const int in_string = rg->fired && rg->depth && grammar_string_depth(g, st) == rg->depth;
    if (!in_string && !rg->closes) return n_allowed;
    size_t n_ending = 0;
    /* inside a character (byte pieces) or an escape the model finishes it first, so the
     * shortest ending does not pick the rest of a character for it */
    if (in_string && grammar_string_between_chars(g, st)) {
        size_t n = 0;
        const int rc = grammar_complete(g, st, scratch, cap, &n);
        /* a prefix of a long completion is enough when it closes the string */
        if (rc == NEEDLE_OK || rc == NEEDLE_ERR_BUFFER_TOO_SMALL)
            n_ending = string_ending(g, st, rg->depth, scratch, n);
    }
    if (!n_ending && !rg->closes) return n_allowed;
    uint32_t kept = 0;
    for (uint32_t v = 0; v < vocab; v++)
        kept += allowed[v] && agrees(rg, g, st, tok, (int32_t)v, scratch, n_ending);
    if (!kept) return n_allowed;
    for (uint32_t v = 0; v < vocab; v++)
        if (allowed[v] && !agrees(rg, g, st, tok, (int32_t)v, scratch, n_ending)) allowed[v] = 0;
    return kept;
}
