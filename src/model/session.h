/* A session: one conversation's state over a shared model (spec §3.1).
 *
 * Everything is allocated in session_create; the forward pass allocates nothing. Tokens
 * are processed in chunks of up to `chunk` positions: matrix products run over the whole
 * chunk (each weight row is decoded once per chunk), attention and the engram conv run
 * token by token in order, so ring buffers can never be overwritten before use.
 *
 * KV cache layout, per layer: `n_sinks` pinned slots for positions [0, n_sinks), then a
 * ring of `window` slots for later positions (slot n_sinks + (p - n_sinks) % window); with
 * no window the ring is the whole context. */
#ifndef NEEDLE_MODEL_SESSION_H
#define NEEDLE_MODEL_SESSION_H

#include "model/model.h"
#include "needle.h"

#define SESSION_HISTORY 32u /* token history ring; must exceed the largest n-gram order */

struct needle_session {
    const struct needle_model *m;
    const struct needle_backend_ops *ops; /* the model's backend (backend/backend.h) */
    void *dev;          /* the backend's per-session state (threads, streams, scratch) */
    uint32_t n_ctx;     /* positions allowed */
    uint32_t window;    /* 0 = full causal attention */
    uint32_t n_sinks;
    uint32_t kv_slots;  /* per layer */
    int32_t kv_type;
    uint32_t chunk;     /* tokens per forward chunk */
    int32_t n_threads;  /* CPU threads asked for (model n_threads; 0 = NEEDLE_THREADS/cores) */

    uint32_t pos;       /* next absolute position */
    int has_logits;
    int32_t history[SESSION_HISTORY];

    /* Below: backend memory (ops->alloc), never dereferenced by shared code. */
    /* KV cache: [layer][slot][kv_dim] in the session's kv_type */
    void *k_cache, *v_cache;
    float *kv_scales;   /* int8 cache: [2][layer][slot][KV_SCALE_GROUPS(kv_dim)] */
    float *scores;      /* [n_heads][kv_slots] attention scratch */

    /* engram: pre-conv values of the last `ev_ring` positions, [site][ring][d] */
    uint32_t ev_ring;
    float *ev_hist;

    /* chunk activations (sizes in session.c) */
    float *lanes;       /* [chunk][n][d] */
    float *nx;          /* [chunk][n*d padded] rotated */
    float *mix;         /* [chunk][n + n + n*n] projections */
    float *u, *bx, *h, *hr, *x2;  /* [chunk][d or padded] */
    float *q, *k, *v, *gate;      /* [chunk][A or kvd] */
    float *o, *attn;              /* [chunk][A padded], [chunk][d] */
    float *eng_er;                /* [chunk][T*sub padded] */
    float *eng_k, *eng_v;         /* [site][chunk][d] */
    float *eng_vhat;              /* [chunk][d] */

    /* host memory */
    float *logits;      /* [vocab] of the last position */
    int skip_logits;    /* set by session_run when the caller needs no logits */
    float *rope_cs;     /* [chunk][head_dim]: cos | sin per position */
    uint32_t *eng_slots; /* [chunk][n_tables] engram table slots */

    struct chat *chat;  /* tools, grammar and cached prefix; NULL for token-level use */
    needle_session_stats stats;
};

#define KV_SCALE_GROUP 32u
/* int8 scale groups per cache row of `kvd` values (the last group may be partial) */
#define KV_SCALE_GROUPS(kvd) (((kvd) + KV_SCALE_GROUP - 1) / KV_SCALE_GROUP)

/* Runs tokens[0:n] at positions pos..pos+n-1; writes [n][vocab] logits to `all_logits` if
 * non-NULL, and always leaves the last position's logits in s->logits. */
int session_forward(struct needle_session *s, const int32_t *tokens, uint32_t n,
                    float *all_logits);

/* session_forward plus bookkeeping (stats, timing); want_logits = 0 skips the output
 * projection for the last token, for tokens whose successor is forced anyway. */
int session_run(struct needle_session *s, const int32_t *tokens, uint32_t n, float *all_logits,
                int want_logits);

/* Re-lays the KV cache for `n_sinks` pinned positions (reallocating it if it must grow).
 * Only valid at position 0; the conversation is reset. */
int session_configure_sinks(struct needle_session *s, uint32_t n_sinks);

/* Among the tokens with allowed[v] != 0 (all when allowed is NULL): the argmax (ties to
 * the lowest id) at temperature 0, else a seeded softmax sample. -1 if none is allowed. */
/* needle_session_create with the operations `ops` instead of the model's backend's (the
 * backend-vs-CPU tests run other implementations of the same interface). */
int session_create_with_ops(const struct needle_model *m, const needle_session_params *params,
                            const struct needle_backend_ops *ops, struct needle_session **out);

/* Copies the engram ring to or from host memory `host` (n_sites * ev_ring * d floats),
 * for the chat prefix snapshot. */
void session_save_engram(struct needle_session *s, float *host);
void session_restore_engram(struct needle_session *s, const float *host);

int32_t session_pick_token(const float *logits, const uint8_t *allowed, uint32_t vocab,
                           float temperature, uint64_t *rng);

#endif
