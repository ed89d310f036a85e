/* repeat_guard.h: the repetition guard of the constrained decode (issue 18).
 *
 * A small model copying a value sometimes falls into a loop inside a string: one piece
 * ("zzzz...") or a short cycle of pieces ("hahaha...", the three byte pieces of one CJK
 * character) again and again until the token budget ends the turn. The guard follows the
 * tokens of the string value being written; once its tail is one cycle of 1 to
 * REPEAT_GUARD_MAX_PERIOD tokens repeated over at least REPEAT_GUARD_MIN_TOKENS tokens, it
 * ends the string the way the budget logic ends a turn: only tokens that begin the
 * grammar's shortest ending of that string (its closing quote, or what a pattern or
 * minLength still needs, then the quote) stay allowed. What was written stays, the JSON
 * stays valid and the model goes on with the rest of the call. That call is the last one:
 * once it is complete only the end of the array is allowed, because a model caught
 * looping in one value tends to go on writing calls full of the same loop (seen on the
 * demo model: call after call of "H H H ..." until the budget).
 *
 * The threshold is set far above the repeats of real values: measured on the demo model's
 * data (README.md, "Repetition guard"), no expected value comes near it, so a value the
 * guard cuts was already wrong, and so was the answer that holds it: ending that answer
 * early cannot make a right answer wrong. Tokens count, not characters: "1000000" or "aaa" are a few
 * repeats and are never touched.
 *
 * Plain data, no allocation; one guard per decode. */
#ifndef NEEDLE_AGENT_REPEAT_GUARD_H
#define NEEDLE_AGENT_REPEAT_GUARD_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

#define REPEAT_GUARD_MAX_PERIOD 4u
#define REPEAT_GUARD_MIN_TOKENS 24u

/* Numbers (issue 31): a digit loop ("632323232323...") is ended the same way, at the
 * number's shortest ending (the byte after it), once a cycle of 1 to REPEAT_GUARD_MAX_PERIOD
 * tokens covers REPEAT_GUARD_MIN_DIGIT_TOKENS tokens of one number. The demo tokenizer
 * writes one digit a token, and an unbounded number has at most 17 digits (the grammar's
 * budget), so the string threshold would never be reached; over the 1,039 numbers of the
 * expected calls in train/data (test, test2, unseen) the longest such tail is 5 tokens (a
 * 4-digit cycle seen once more by one digit, "863.78"), so 8 (two whole 4-digit cycles,
 * eight equal digits) is not reached by a real value. A cycle of zeros never fires: round
 * numbers ("1000000000") are written so. */
#define REPEAT_GUARD_MIN_DIGIT_TOKENS 8u

typedef struct repeat_guard {
    uint32_t depth; /* grammar_string_depth (or number depth) of the value followed; 0 = none */
    int number;     /* the value followed is a number */
    uint32_t zeros; /* trailing tokens of the number made of '0' bytes only */
    uint32_t count; /* tokens of that string so far (the first, partial one not counted) */
    int32_t recent[REPEAT_GUARD_MAX_PERIOD]; /* the last tokens, recent[count % PERIOD] next */
    /* run[p - 1]: trailing tokens each equal to the token p places before it */
    uint32_t run[REPEAT_GUARD_MAX_PERIOD];
    int fired;      /* the string followed must end now */
    uint32_t closes; /* strings of this decode the guard fired in */
} repeat_guard;

/* Forgets everything (outside any string; no string of the decode cut yet). */
void repeat_guard_reset(repeat_guard *rg);

/* Model-free detector: adds the next token of one string value. Returns 1 when the tail
 * of the value is a cycle of p <= REPEAT_GUARD_MAX_PERIOD tokens whose repeats cover at
 * least REPEAT_GUARD_MIN_TOKENS tokens (then rg->fired is set and, the first time for
 * this string, rg->closes counts it), else 0. */
int repeat_guard_push(repeat_guard *rg, int32_t tok);

/* The same detector for the tokens of one number: a cycle covering
 * REPEAT_GUARD_MIN_DIGIT_TOKENS tokens fires unless the cycle is all zeros (zeros: the
 * token's bytes are '0' only). */
int repeat_guard_push_digits(repeat_guard *rg, int32_t tok, int zeros);

/* Steps st over the n bytes of token tok, as grammar_accept_bytes does (1 accepted; on 0
 * st is unchanged), and follows the string and number values: a token that starts and
 * ends inside one value is pushed; any other token ends the value followed, or starts
 * following the one it opens. */
int repeat_guard_accept(repeat_guard *rg, const grammar *g, grammar_state *st, int32_t tok,
                        const char *bytes, size_t n);

/* The allowed tokens after the guard fired: keeps those (already allowed by the grammar
 * from st) whose bytes agree with the shortest ending of the string (or number) followed, found with
 * grammar_complete in scratch[0..cap), and, once a value of the decode was cut, none
 * whose bytes start another call (a "," after a complete call, also inside a longer
 * token such as "}},{"). Returns the number kept. When nothing applies, or no allowed
 * token would be kept, allowed is left as it was and n_allowed is returned. Inside a
 * character or an escape the string is not ended yet (it ends at the next character
 * boundary). */
uint32_t repeat_guard_restrict(const repeat_guard *rg, const grammar *g, const grammar_state *st,
                               const tokenizer *tok, uint8_t *allowed, uint32_t vocab,
                               uint32_t n_allowed, char *scratch, size_t cap);

#endif
