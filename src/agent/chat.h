/* Conversations with tools (chat.c): the state of one conversation over a model session,
 * behind the public calls of needle.h (needle_session_set_tools, _complete, _append_turn,
 * _prefix_length), which src/api/session.c implements as thin functions over these.
 *
 * A conversation runs on a chat_env, the parts of the public session it works with; the
 * public session (src/api/session.h) owns the env and the conversation and composes them,
 * so the model session below knows nothing of either. */
#ifndef NEEDLE_AGENT_CHAT_H
#define NEEDLE_AGENT_CHAT_H

#include "model/session.h"
#include "needle.h"

/* A test's stand-in for a model's preferences: rewrites logits[vocab], the last
 * position's, after a run of a turn over tokens[0..n) that computed them. */
typedef void (*chat_logits_fn)(void *user, const int32_t *tokens, uint32_t n, float *logits,
                               uint32_t vocab);

typedef struct chat_env {
    model_session *core;     /* the conversation's KV cache, position and logits */
    model_session *embedder; /* tool retrieval's embeddings (model/embed.c), made on first use */
    needle_callbacks cb;     /* needle_session_set_callbacks; zeroed = none */
    chat_logits_fn logits_hook; /* tests only (api/session.h); NULL = none */
    void *logits_hook_user;
    /* `needle calibrate` only (api/session.h): also receives every cell the confidence head
     * pools, from the conversation's next set_tools on; NULL = none */
    const session_cells *cells_tap;
} chat_env;

struct chat;

/* A conversation on env (which must outlive it) with these tools and system facts: the
 * prefix is rendered, encoded and prefilled, and becomes the base session_reset returns
 * to. The conversation in *slot, if any, is freed when the new prefix starts replacing
 * it: a failure before that leaves *slot as it was, a failure after it leaves NULL. */
int chat_create(chat_env *env, const char *system, const char *tools_json,
                const needle_tools_params *params, struct chat **slot);
void chat_free(struct chat *c); /* NULL: no-op */

/* session_reset ran on the core: back to the state after the prefix. */
void chat_on_reset(struct chat *c);

/* Where the forward pass's cells go while the conversation is attached (its confidence
 * pools them), or NULL: what needle_session_eval / _generate pass along. */
const session_cells *chat_cells(const struct chat *c);

uint32_t chat_prefix_length(const struct chat *c);

/* needle_session_complete and needle_session_append_turn on the conversation. */
int chat_complete(struct chat *c, const char *text, const needle_complete_params *params,
                  char *out, size_t cap, size_t *len);
int chat_append_turn(struct chat *c, const char *text, int32_t turn_kind,
                     const char *calls_json);

#endif
