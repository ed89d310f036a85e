/* The repetition guard (repeat_guard.h): a detector over the tokens of one string value,
 * and the grammar side that follows values and finds the tokens that end one. */
#include "agent/repeat_guard.h"

#include <string.h>

#include "util/error.h"

void repeat_guard_reset(repeat_guard *rg) { memset(rg, 0, sizeof *rg); }

/* Stops following a value (and starts on the one at `depth`, if not 0: a number when
 * `number`); the decode's count of cut values stays. */
static void follow(repeat_guard *rg, uint32_t depth, int number) {
    const uint32_t closes = rg->closes;
    repeat_guard_reset(rg);
    rg->closes = closes;
    rg->depth = depth;
    rg->number = depth && number;
}

/* The value st is inside: its string depth, else its number depth (*number set), else 0. */
static uint32_t value_depth(const grammar *g, const grammar_state *st, int *number) {
    const uint32_t d = grammar_string_depth(g, st);
    *number = 0;
    if (d) return d;
    const uint32_t dn = grammar_number_depth(g, st);
    *number = dn != 0;
    return dn;
}

/* min_tokens: the threshold; zeros: the token is all '0' (a cycle of such tokens is
 * exempt when exempt_zeros). */
static int push(repeat_guard *rg, int32_t tok, uint32_t min_tokens, int exempt_zeros, int zeros) {
    const uint32_t P = REPEAT_GUARD_MAX_PERIOD;
    rg->zeros = zeros ? rg->zeros + 1 : 0;
    for (uint32_t p = 1; p <= P; p++) {
        /* recent[(count - p) % P] is still the token p places back: the slot written
         * below held the one P places back */
        if (rg->count >= p && rg->recent[(rg->count - p) % P] == tok) rg->run[p - 1]++;
        else rg->run[p - 1] = 0;
        /* a tail periodic with period p over run + p tokens: the first p tokens of the
         * cycle, then run tokens that repeat it; its last p tokens all zeros is a cycle of
         * zeros */
        if (rg->run[p - 1] + p >= min_tokens && !rg->fired && !(exempt_zeros && rg->zeros >= p)) {
            rg->fired = 1;
            rg->closes++;
        }
    }
    rg->recent[rg->count % P] = tok;
    rg->count++;
    return rg->fired;
}

int repeat_guard_push(repeat_guard *rg, int32_t tok) {
    return push(rg, tok, REPEAT_GUARD_MIN_TOKENS, 0, 0);
}

int repeat_guard_push_digits(repeat_guard *rg, int32_t tok, int zeros) {
    return push(rg, tok, REPEAT_GUARD_MIN_DIGIT_TOKENS, 1, zeros);
}

static int all_zeros(const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (bytes[i] != '0') return 0;
    return n != 0;
}

int repeat_guard_accept(repeat_guard *rg, const grammar *g, grammar_state *st, int32_t tok,
                        const char *bytes, size_t n) {
    int number = 0, number_now = 0;
    const uint32_t d0 = value_depth(g, st, &number);
    grammar_state tmp;
    grammar_state_copy(&tmp, st);
    int inside = d0 != 0;
    for (size_t i = 0; i < n; i++) {
        if (!grammar_accept_byte(g, &tmp, (uint8_t)bytes[i])) return 0;
        if (value_depth(g, &tmp, &number_now) != d0 || number_now != number) inside = 0;
    }
    grammar_state_copy(st, &tmp);
    if (inside && n) {
        /* not followed yet: from here on */
        if (rg->depth != d0 || rg->number != number) follow(rg, d0, number);
        if (number) repeat_guard_push_digits(rg, tok, all_zeros(bytes, n));
        else repeat_guard_push(rg, tok);
    } else {
        /* the token left the value followed, or opened one: its bytes inside the new
         * value are a fragment, not counted */
        const uint32_t d = value_depth(g, st, &number_now);
        follow(rg, d, number_now);
    }
    return 1;
}

/* Length of the bytes of `ending` that finish the value at `depth` from st (the byte
 * that closes a string, or the first byte after a number, included); 0 if they do not
 * within n bytes. */
static size_t value_ending(const grammar *g, const grammar_state *st, uint32_t depth,
                           const char *ending, size_t n) {
    grammar_state probe;
    grammar_state_copy(&probe, st);
    int number = 0;
    for (size_t i = 0; i < n; i++) {
        if (!grammar_accept_byte(g, &probe, (uint8_t)ending[i])) return 0;
        if (value_depth(g, &probe, &number) != depth) return i + 1;
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
    int number = 0;
    const int in_value = rg->fired && rg->depth && value_depth(g, st, &number) == rg->depth &&
                         number == rg->number;
    if (!in_value && !rg->closes) return n_allowed;
    size_t n_ending = 0;
    /* inside a character (byte pieces) or an escape the model finishes it first, so the
     * shortest ending does not pick the rest of a character for it; a number has neither */
    if (in_value && (number || grammar_string_between_chars(g, st))) {
        size_t n = 0;
        const int rc = grammar_complete(g, st, scratch, cap, &n);
        /* a prefix of a long completion is enough when it ends the value */
        if (rc == NEEDLE_OK || rc == NEEDLE_ERR_BUFFER_TOO_SMALL)
            n_ending = value_ending(g, st, rg->depth, scratch, n);
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
