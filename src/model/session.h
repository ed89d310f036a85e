/* A session: one conversation's state over a shared model (spec §3.1).
 *
 * Everything is allocated in session_create; the forward pass allocates nothing. Tokens
 * are processed in chunks of up to `chunk` positions: matrix products run over the whole
 * chunk (each weight row is decoded once per chunk), attention and the engram conv run
 * token by token in order, so ring buffers can never be overwritten before use. The KV
 * cache and its layout live in the backend context `bk` (backend/backend.h), which is all
 * the backend operations see of a session.
 *
 * This is the model layer's session, not the public one: `struct needle_session`
 * (src/api/session.h) composes one of these with a conversation, an embedder and the
 * callbacks, and nothing here knows of those. Layers above (agent/, api/) use the
 * functions below, never the fields: they run tokens (handing the forward the logits they
 * want, the cells' receiver and the callbacks as arguments), save and restore a
 * checkpoint, and set the base that session_reset returns to.
 *
 * Two ways back, two names:
 *   - session_reset: back to the session's base, the state a layer above pinned with
 *     session_set_base (the end of a tools prefix), or position 0 if none was pinned.
 *   - session_checkpoint_restore: back to an earlier checkpoint (the start of a turn
 *     that failed), saved with the number of positions it must survive. */
#ifndef NEEDLE_MODEL_SESSION_H
#define NEEDLE_MODEL_SESSION_H

#include "backend/backend.h"
#include "model/model.h"
#include "needle.h"

#define SESSION_HISTORY 32u /* token history ring; must exceed the largest n-gram order */

/* Receives the forward pass's cells (spec §4.1) as they are computed: for the n tokens of
 * a chunk, cell index 0 (the scaled embedding) and then i = 1..L (the lane mean after layer
 * i-1). cells is host memory [n][d], valid during the call only. */
typedef void (*session_cell_fn)(void *user, const int32_t *tokens, uint32_t n, uint32_t cell,
                                const float *cells);

/* Who receives a forward pass's cells (an argument of the run; NULL or fn NULL: nobody). */
typedef struct session_cells {
    session_cell_fn fn;
    void *user;
} session_cells;

typedef struct model_session model_session;

/* A saved conversation state: what is needed, besides the KV entries still in the cache,
 * to continue from an earlier position. */
typedef struct session_checkpoint {
    uint32_t pos;
    uint32_t horizon;   /* later positions after which it can still be restored */
    int32_t history[SESSION_HISTORY];
    float *engram;      /* host copy of the engram ring, [n_sites][ev_ring][d]; NULL if none */
    uint8_t *kv;        /* host copy of each layer's KV rows a restore needs (session.c
                         * kv_layer_keep), layer by layer */
    size_t kv_cap;
    size_t kv_rows;     /* rows of all layers in kv */
    uint32_t kv_sinks;  /* the session's sinks when saved (the layout the rows are in) */
} session_checkpoint;

struct model_session {
    const struct needle_model *m;
    const struct needle_backend_ops *ops; /* the model's backend (backend/backend.h) */
    backend_ctx bk;     /* what the ops see: weights, backend state, KV cache, engram ring */
    kv_layer_layout *kv_layers; /* bk.kv_layers (owned) */
    size_t kv_cap_rows;         /* cache rows the K/V buffers hold */
    uint32_t kv_cap_slots;      /* positions per head the scores buffer holds */
    uint32_t n_ctx;     /* positions allowed */

    uint32_t pos;       /* next absolute position */
    int has_logits;
    int32_t history[SESSION_HISTORY];

    /* Below: backend memory (ops->alloc), never dereferenced by shared code. */
    /* engram: pre-conv values of the last `bk.ev_ring` positions, [site][ring][d] */
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
    float *rope_cs;     /* [chunk][head_dim]: cos | sin per position */
    uint32_t *eng_slots; /* [chunk][n_tables] engram table slots */

    int has_base;       /* session_reset restores `base` (else position 0) */
    session_checkpoint base;

    needle_session_stats stats;

    /* host scratch for the cells a run hands to its receiver (session_cells) */
    float *cell_lanes;  /* [chunk][n][d] */
    float *cell_mean;   /* [chunk][d] */
};

/* Runs one backend operation and adds its wall time to the session's profile field. */
#define TIMED(field, call)                          \
    do {                                            \
        const double t0_ = util_clock_ms();         \
        call;                                       \
        s->stats.field += util_clock_ms() - t0_;    \
    } while (0)

/* A product whose input rows are at a QAT point (forward.c): under W·A8 (s->bk.a8) `xr`
 * holds A8 rows and the backend's matmul_a8 runs, else rotated floats and matmul. */
void forward_act_matmul(model_session *s, const float *xr, size_t ld_x, uint32_t n,
                        const cq_job *jobs, uint32_t njobs);

/* The steps of one layer over the n tokens of the chunk (forward.c), in the order an
 * architecture's layer function (arch.h) calls them, with its attention and MLP ops:
 *   mix_lanes: lane_norm and the phi products of file layer `phi_layer` into s->mix
 *     (a ladder rung runs a subset of the file's layers);
 *   read_lanes: the lane read (with the layer's engram site) into s->u, s->bx, s->hr;
 *   project_qkvg: q, k, v, gate from s->hr (widths from qk_dim and v_dim);
 *   project_out: out_proj of the attention output s->o into s->attn;
 *   attention_residual: x2 = bx + gated ZC(attn), h = ZC(x2) for the MLP;
 *   write_lanes: the MLP output in s->attn back into the lanes. */
void forward_mix_lanes(model_session *s, uint32_t phi_layer, uint32_t n);
void forward_read_lanes(model_session *s, uint32_t li, uint32_t n);
void forward_project_qkvg(model_session *s, uint32_t li, uint32_t n);
void forward_project_out(model_session *s, uint32_t li, uint32_t n);
void forward_attention_residual(model_session *s, uint32_t li, uint32_t n);
void forward_write_lanes(model_session *s, uint32_t li, uint32_t n);

/* Sets the logits of ids past out_vocab (input-only rows) to -inf in `count` rows of
 * `vocab` (a no-op where out_vocab = vocab). */
void forward_mask_input_only(const struct needle_model *m, float *logits, uint32_t count);

/* The logits a forward pass leaves in s->logits for its last position. */
typedef struct logits_request {
    int skip;            /* 1: none (the next token is forced); all_logits overrides it */
    const int32_t *rows; /* NULL: every id; else only these (ascending, distinct), the
                          * others -INFINITY (session_run_rows) */
    uint32_t n_rows;
} logits_request;

/* Runs tokens[0:n] at positions pos..pos+n-1; writes [n][vocab] logits to `all_logits` if
 * non-NULL, and leaves the last position's logits in s->logits as `want` asks (NULL: all
 * ids); hands every cell to `cells` (NULL: none). */
int session_forward(model_session *s, const int32_t *tokens, uint32_t n,
                    float *all_logits, const logits_request *want, const session_cells *cells);

/* session_forward plus bookkeeping (stats, timing); want_logits = 0 skips the output
 * projection for the last token, for tokens whose successor is forced anyway. */
int session_run(model_session *s, const int32_t *tokens, uint32_t n, float *all_logits,
                int want_logits, const session_cells *cells);

/* session_run for a prompt: chunk by chunk when cb has a prefill callback, reporting
 * progress after each; NEEDLE_ERR_CANCELLED when the callback asks to stop (the chunks run
 * so far stay evaluated). Chunks of the forward pass's own size give the same numbers. */
int session_prefill(model_session *s, const int32_t *tokens, uint32_t n, int want_logits,
                    const needle_callbacks *cb, const session_cells *cells);

/* Reports a decoded piece to cb's token callback, if any; NEEDLE_ERR_CANCELLED when it
 * asks to stop. */
int session_emit(const needle_callbacks *cb, int32_t kind, int32_t token, const char *text,
                 size_t len);

/* session_run with the logits of the last token computed only for the ids rows[0..n_rows)
 * (ascending, distinct; the next token must be one of them): s->logits holds exactly the
 * values a full run gives for those ids and -INFINITY for the others. A backend without
 * the subset operation computes them all, then masks. */
int session_run_rows(model_session *s, const int32_t *tokens, uint32_t n,
                     const int32_t *rows, uint32_t n_rows, const session_cells *cells);

/* Re-lays the KV cache for `n_sinks` pinned positions (reallocating it if it must grow).
 * The conversation restarts at position 0 and the base is dropped. */
int session_configure_sinks(model_session *s, uint32_t n_sinks);

/* needle_session_default_params's values. */
needle_session_params session_default_params(void);
/* A session on the model's backend (the one chosen at model open); *out only on success. */
int session_create(const struct needle_model *m, const needle_session_params *params,
                   model_session **out);
/* session_create with the operations `ops` instead of the model's backend's (the
 * backend-vs-CPU tests run other implementations of the same interface). */
int session_create_with_ops(const struct needle_model *m, const needle_session_params *params,
                            const struct needle_backend_ops *ops, model_session **out);
void session_free(model_session *s); /* NULL: no-op */

/* Saves the current state into cp (zero-initialize cp before its first save), to be
 * restorable after up to `horizon` more positions: with a sliding window, the KV rows
 * this state attends to that those positions would overwrite are copied to host memory
 * (none when the conversation stays within the window). 0 or NEEDLE_ERR_OUT_OF_MEMORY. */
int session_checkpoint_save(model_session *s, session_checkpoint *cp, uint32_t horizon);

/* Returns the session to cp, saved earlier in the same run of positions (the session has
 * only moved forward since, by at most cp->horizon). The logits are dropped. Fails with
 * NEEDLE_ERR_STATE, leaving the session unchanged, otherwise. */
int session_checkpoint_restore(model_session *s, const session_checkpoint *cp);
void session_checkpoint_free(session_checkpoint *cp);

/* Pins the current state as the base session_reset returns to, whatever follows (a tools
 * prefix, agent/chat.c, is pinned as sinks first, so nothing needs copying). */
int session_set_base(model_session *s);
/* Back to the base (or position 0 without one); the logits are dropped. */
void session_reset(model_session *s);

/* The contrastive head's unit embedding (the head's out_dim floats, model/heads.h) of ids[0:n]
 * run from position 0 in *embedder, a second session over like's model made on first use
 * with like's context, window and KV type (so embedding never disturbs like's
 * conversation); the embedder's work is added to like's counters. NEEDLE_ERR_STATE
 * without a contrastive head, NEEDLE_ERR_CONTEXT_FULL when n exceeds the context. */
int session_embed_tokens(model_session *like, model_session **embedder, const int32_t *ids,
                         size_t n, float *out);
/* session_embed_tokens of [BOS] + text encoded as a prompt is (dummy prefix on); *n_out is
 * the embedding's width, which must fit in cap (needle_session_embed). */
int session_embed_text(model_session *like, model_session **embedder, const char *text,
                       float *out, size_t cap, size_t *n_out);

/* The public session's evaluation and generation (needle_session_eval / _generate, whose
 * contracts needle.h gives), with the cells' receiver and callbacks of the layer above. */
int session_eval(model_session *s, const int32_t *tokens, size_t n, float *logits, size_t cap,
                 const session_cells *cells);
int session_generate(model_session *s, const int32_t *prompt, size_t n_prompt,
                     const needle_generate_params *params, const needle_callbacks *cb,
                     const session_cells *cells, int32_t *out, size_t cap, size_t *n_out);

/* Read access for the layers above. */
const struct needle_model *session_model(const model_session *s);
uint32_t session_context_length(const model_session *s);
uint32_t session_window(const model_session *s);
uint32_t session_position(const model_session *s);
/* The last position's logits ([vocab], host), or NULL when none are current. */
const float *session_logits(const model_session *s);
/* The same, writable: for the decoding tests' stand-in preferences (api/session.h). */
float *session_logits_mut(model_session *s);
/* Bytes the session's KV cache holds: K and V rows of every layer (int8: with scales). */
size_t session_kv_bytes(const model_session *s);
/* The counters, for a layer above to add its own (grammar time, decode steps). */
needle_session_stats *session_stats(model_session *s);
/* The counters with the backend's and the KV cache's figures (needle_session_get_stats). */
int session_get_stats(const model_session *s, needle_session_stats *out);

/* Among the tokens with allowed[v] != 0 (all when allowed is NULL): the argmax (ties to
 * the lowest id) at temperature 0, else a seeded softmax sample. -1 if none is allowed. */
int32_t session_pick_token(const float *logits, const uint8_t *allowed, uint32_t vocab,
                           float temperature, uint64_t *rng);

#endif
