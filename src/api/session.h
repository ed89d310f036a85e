/* The public session: `struct needle_session` is a composite of the parts the layers
 * below provide, and every needle_session_* function (needle.h) is a thin function over
 * them in session.c:
 *   env.core      the model session (model/session.h): KV cache, position, logits;
 *   env.embedder  a second model session for embeddings (model/embed.c), made on first use;
 *   env.cb        the callbacks (needle_session_set_callbacks);
 *   chat          the conversation (agent/chat.h), from needle_session_set_tools on.
 * The model session knows nothing of the others: a run is handed the cells' receiver
 * (the conversation's confidence) and the callbacks as arguments, and a reset here resets
 * the core and then the conversation. */
#ifndef NEEDLE_API_SESSION_H
#define NEEDLE_API_SESSION_H

#include "agent/chat.h"
#include "needle.h"

struct needle_session {
    chat_env env;       /* core, embedder, callbacks: what the conversation runs on */
    struct chat *chat;  /* NULL until needle_session_set_tools succeeds */
};

/* Tests only: from now on every run of a turn that computes logits passes them through fn
 * before anything reads them (NULL removes it). The tests of the decoding guards use it to
 * make a model loop on purpose. */
void api_session_set_logits_hook(needle_session *s, chat_logits_fn fn, void *user);

/* `needle calibrate` only: from the next needle_session_set_tools on, `tap` (NULL: none;
 * it must outlive its use) receives every cell a confidence head would pool (whether the
 * model has one or not), in the order the forward pass makes them. */
void api_session_set_cells_tap(needle_session *s, const session_cells *tap);

/* The model session under s, for tests that drive the forward pass directly. */
model_session *api_session_core(needle_session *s);

#endif
