/* The envelope's "confidence" (spec §4.4) for a conversation (agent/chat.c).
 *
 * confidence = min(head, decoding), both in [0, 1]:
 *   head      sigmoid of the confidence probe head (model/heads.h) pooled over every cell
 *             of the conversation so far: BOS, the tools prefix, earlier turns, this turn's
 *             text and the answer through its closing <|im_end|> ("the full prompt plus
 *             the call the model just produced"). The cells are pooled as the forward pass
 *             makes them, so this costs no second pass; a model without the head skips it.
 *   decoding  the geometric mean of the model's probability of each call-array token the
 *             decoder chose, among the tokens the grammar allowed at that step (softmax
 *             over the allowed ids' logits); tokens the grammar forced carry no choice and
 *             are left out (none chosen: 1). Over the allowed ids only, because the decode
 *             loop may compute only their logits (sparse logits, agent/chat.c): the value
 *             is then the same whether the other rows were computed or not.
 * Both choices are ours where the official sources are silent (spec §8.6 item 7). A Needle 3
 * file's confidence head pools the same cells in two stages (model/heads.h, NEEDLE3.md
 * §3): it scores BOS + prompt + completion, the rule of the official 3.x engine.
 *
 * The pooling state follows the conversation: pinned after the tools prefix (what
 * needle_session_reset returns to) and saved at the start of each turn (what a failed
 * turn rolls back to). */
#ifndef NEEDLE_AGENT_CONFIDENCE_H
#define NEEDLE_AGENT_CONFIDENCE_H

#include "model/heads.h"
#include "model/session.h"

typedef struct confidence_state {
    int has_head;
    const session_cells *tap; /* also handed every pooled cell (chat_env.cells_tap) */
    head_pool pool, base, turn_start;
    session_cells cells;  /* what the conversation's runs hand their cells to: pool */
    double log_prob_sum;  /* this turn's chosen call tokens */
    uint32_t choices;
} confidence_state;

/* Sets up the pools when m has a confidence head; cs must then stay at this address, since
 * confidence_cells points into it. `tap` (NULL: none) receives each cell after the pool,
 * and receives them also when m has no confidence head (the confidence is then the
 * decoding's alone). */
int confidence_attach(confidence_state *cs, const struct needle_model *m, const session_cells *tap);
void confidence_free(confidence_state *cs);
/* The receiver every run of the conversation passes to the forward pass (model/session.h),
 * or NULL without a head and a tap. */
const session_cells *confidence_cells(const confidence_state *cs);

void confidence_restart(confidence_state *cs);     /* a new prefix starts at position 0 */
void confidence_pin_base(confidence_state *cs);    /* the tools prefix has run */
void confidence_on_reset(confidence_state *cs);    /* back to the pinned base */
void confidence_turn_begin(confidence_state *cs);  /* a turn starts here */
void confidence_turn_abort(confidence_state *cs);  /* the turn is rolled back */

/* The decoder chose `tok` with these logits (host [vocab]) inside the call array. */
/* allowed: [vocab] nonzero for the ids the grammar allowed (tok among them) */
void confidence_add_choice(confidence_state *cs, const float *logits, const uint8_t *allowed,
                           uint32_t vocab, int32_t tok);

/* The turn's confidence in [0, 1] (see above); the head's time goes to stats. */
double confidence_value(const confidence_state *cs, needle_session_stats *stats);

#endif
