/* The token budget of a turn's call array (agent/chat.c): whatever the model picks, the
 * turn ends with a complete, valid array within max_new_tokens.
 *
 * The planner keeps a verified ending: bytes that close the array from the current
 * grammar state (grammar_complete: required properties, minimal items and lengths,
 * shortest pattern matches) and fit in what is left of the budget. Each token the model
 * picks is checked first: when a valid ending still fits after it, that ending becomes
 * the plan; when none does, the turn switches to closing and follows the plan, one
 * allowed token covering the longest prefix of what remains of it at a time, to the end.
 * Two markers, </tool_call> and <|im_end|>, always follow the array; the check counts
 * them. */
#ifndef NEEDLE_AGENT_BUDGET_H
#define NEEDLE_AGENT_BUDGET_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

typedef struct budget_plan {
    char *plan;          /* [cap] the verified ending from the current state */
    char *scratch;       /* [cap] the ending found for a candidate token */
    size_t cap;
    grammar_state probe; /* the state after a candidate token */
    size_t plan_len, plan_pos; /* the plan's bytes, and how far the turn followed them */
    size_t min_json;     /* bytes of the shortest call array from the array's start */
    int closing;         /* following the plan to the end */
    int ended;           /* closing was needed at some point of the turn */
} budget_plan;

/* Room for plans of a turn of max_new_tokens (one byte per token at least). */
int budget_reserve(budget_plan *b, size_t max_new_tokens);
void budget_free(budget_plan *b);

/* The array starts in state gs: its shortest ending, if it fits in max_new_tokens bytes
 * (budget_reserve'd), is the first plan. */
void budget_start(budget_plan *b, const grammar *g, const grammar_state *gs,
                  size_t max_new_tokens);

/* The allowed token that covers the longest prefix of what is left of the plan; -1 when
 * none does. */
int32_t budget_closing_token(const budget_plan *b, const tokenizer *tok, const uint8_t *allowed,
                             uint32_t vocab);

/* The model picked `picked` (an array token, not </tool_call>) in state gs with `left`
 * tokens of the budget left, picked included. Returns the token to take: picked, when a
 * valid ending still fits after it (that ending becomes the plan), else the plan's next
 * token, from here on closing. */
int32_t budget_check(budget_plan *b, const grammar *g, const grammar_state *gs,
                     const tokenizer *tok, const uint8_t *allowed, uint32_t vocab,
                     int32_t picked, uint32_t left);

/* `token` (an array token) was taken while closing: the plan advances past its bytes, or,
 * when the token left the plan (none fitted, or a forced token covered more than what was
 * left of it), the plan is dropped and the turn goes on like any other. */
void budget_follow(budget_plan *b, const tokenizer *tok, int32_t token);

#endif
