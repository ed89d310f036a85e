/* Embeddings from the contrastive probe head (spec §4.3): needle_session_embed's and what
 * tool retrieval (agent/retrieval.c) builds on.
 *
 * What is embedded: [BOS] followed by the text encoded as a prompt is (dummy prefix on),
 * from position 0, alone; the official package's encode_contrastive takes a token
 * sequence and leaves that choice to the engine (spec §4.4). The run happens in a second
 * session (the embedder, which the caller owns: the public session composes it) made on
 * first use with the same context, window and KV type, so
 * a conversation in progress is never touched, and its cells are pooled as they come
 * (model/heads.h): one forward pass, no logits. */
#include <stdlib.h>
#include <string.h>

#include "model/heads.h"
#include "model/session.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/error.h"

static void pool_cells(void *user, const int32_t *tokens, uint32_t n, uint32_t cell,
                       const float *cells) {
    head_pool_add(user, tokens, n, cell, cells);
}

static int make_embedder(const model_session *like, model_session **embedder) {
    if (*embedder) return NEEDLE_OK;
    needle_session_params p = session_default_params();
    p.n_ctx = like->n_ctx;
    p.kv_window = (int32_t)like->bk.window;
    p.kv_type = like->bk.kv_type;
    return session_create_with_ops(like->m, &p, like->ops, embedder);
}

int session_embed_tokens(model_session *s, model_session **embedder, const int32_t *ids,
                         size_t n, float *out) {
    const probe_head *head = model_probe_head(s->m, HEAD_CODE_CONTRASTIVE);
    if (!head)
        return needle_fail(NEEDLE_ERR_STATE, "embed: the model has no contrastive (retrieval) "
                           "probe head");
    if (n == 0) return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "embed: no tokens");
    if (n > s->n_ctx)
        return needle_fail(NEEDLE_ERR_CONTEXT_FULL, "embed: %zu tokens, the context holds %u",
                           n, s->n_ctx);
    int rc = make_embedder(s, embedder);
    if (rc) return rc;
    model_session *e = *embedder;
    head_pool pool;
    if ((rc = head_pool_init(&pool, head, s->m->w.d))) return rc;
    session_reset(e); /* no base: back to position 0 */
    const session_cells to_pool = {pool_cells, &pool};
    rc = session_run(e, ids, (uint32_t)n, NULL, 0, &to_pool);
    if (rc == NEEDLE_OK) {
        const double t0 = util_clock_ms();
        rc = head_pool_output(&pool, out);
        e->stats.heads_ms += util_clock_ms() - t0;
    }
    /* the embedder's work counts as the session's own */
    s->stats.heads_ms += e->stats.heads_ms;
    s->stats.forward_ms += e->stats.forward_ms;
    s->stats.tokens_evaluated += e->stats.tokens_evaluated;
    memset(&e->stats, 0, sizeof e->stats);
    e->stats.size = sizeof e->stats;
    head_pool_free(&pool);
    return rc;
}

int session_embed_text(model_session *s, model_session **embedder, const char *text,
                       float *out, size_t cap, size_t *n_out) {
    if (!text || !n_out || (!out && cap))
        return needle_fail(NEEDLE_ERR_INVALID_ARGUMENT, "embed: NULL argument");
    const struct needle_model *m = s->m;
    const probe_head *head = model_probe_head(m, HEAD_CODE_CONTRASTIVE);
    if (!head)
        return needle_fail(NEEDLE_ERR_STATE, "embed: the model has no contrastive (retrieval) "
                           "probe head");
    /* Needle 2: 128; Needle 3: the embedding head's width (128 as shipped) */
    *n_out = head->out_dim;
    if (cap < head->out_dim)
        return needle_fail(NEEDLE_ERR_BUFFER_TOO_SMALL, "embed: the embedding has %u floats, "
                           "the buffer holds %zu", head->out_dim, cap);
    if (!m->tok) return needle_fail(NEEDLE_ERR_NO_TOKENIZER, "embed: the model has no tokenizer");
    const size_t len = strlen(text);
    size_t need = 0;
    int rc = tokenizer_encode_ex(m->tok, text, len, 1, NULL, 0, &need);
    if (rc && rc != NEEDLE_ERR_BUFFER_TOO_SMALL) return rc;
    int32_t *ids = malloc((need + 1) * sizeof *ids);
    if (!ids) return needle_fail(NEEDLE_ERR_OUT_OF_MEMORY, "embed: out of memory");
    ids[0] = NEEDLE_TOKEN_BOS;
    size_t n = 0;
    rc = tokenizer_encode_ex(m->tok, text, len, 1, ids + 1, need, &n);
    if (rc == NEEDLE_OK) rc = session_embed_tokens(s, embedder, ids, n + 1, out);
    free(ids);
    if (rc == NEEDLE_OK) needle_clear_error();
    return rc;
}
